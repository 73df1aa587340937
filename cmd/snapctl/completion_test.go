package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// completionScript is `snapctl completion SHELL`'s output, in a file.
func completionScript(t *testing.T, shell string) string {
	t.Helper()
	s := &server{t: t, addr: closedPort(t)} // nothing is called
	r := s.wantExit(exitOK, "completion", shell)
	path := filepath.Join(t.TempDir(), "snapctl."+shell)
	if err := os.WriteFile(path, []byte(r.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// shellLines runs script in shell and returns its output's lines.
func shellLines(t *testing.T, shell string, args ...string) []string {
	t.Helper()
	if _, err := exec.LookPath(shell); err != nil {
		t.Skipf("no %s on PATH (Debian: apt-get install %s)", shell, shell)
	}
	out, err := exec.Command(shell, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", shell, args, err, out)
	}
	var lines []string
	for l := range strings.Lines(string(out)) {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// completionCases are command lines, the last word being completed, and
// what must be offered.
var completionCases = []struct {
	words []string
	want  []string
}{
	{[]string{""}, []string{"run", "events", "sidecar", "completion", "version"}},
	{[]string{"run", ""}, []string{"create", "watch", "reissue-token"}},
	{[]string{"run", "cr"}, []string{"create"}},
	{[]string{"run", "create", "r1", "--wo"}, []string{"--world-size"}},
	// A connection flag's value is skipped in finding the command.
	{[]string{"--addr", "h:1", "run", "watch", "r1", "--f"}, []string{"--from-now"}},
	{[]string{"events", "r1", "--f"}, []string{"--follow"}},
	{[]string{"-o", ""}, []string{"table", "json"}},
	{[]string{"completion", ""}, []string{"bash", "zsh", "fish"}},
}

func TestCompletionBash(t *testing.T) {
	script := completionScript(t, "bash")
	for _, tc := range completionCases {
		got := shellLines(t, "bash", append([]string{"--norc", "--noprofile", "-c",
			`source "$1" && shift && COMP_WORDS=(snapctl "$@") && COMP_CWORD=$# && _snapctl && printf '%s\n' "${COMPREPLY[@]}"`,
			"bash", script}, tc.words...)...)
		for _, w := range tc.want {
			if !slices.Contains(got, w) {
				t.Errorf("snapctl %s<TAB>: bash offers %v, want %q among them", strings.Join(tc.words, " "), got, w)
			}
		}
		if cur := tc.words[len(tc.words)-1]; cur != "" {
			for _, g := range got {
				if !strings.HasPrefix(g, cur) {
					t.Errorf("snapctl %s<TAB>: bash offers %q, which does not start with %q", strings.Join(tc.words, " "), g, cur)
				}
			}
		}
	}
	// A flag's value is the shell's to complete (a file, a RUN_ID): none offered.
	if got := shellLines(t, "bash", "--norc", "--noprofile", "-c",
		`source "$1" && COMP_WORDS=(snapctl run create r1 --budget "") && COMP_CWORD=5 && _snapctl; echo "n=${#COMPREPLY[@]}"`,
		"bash", script); !slices.Equal(got, []string{"n=0"}) {
		t.Errorf("snapctl run create r1 --budget <TAB>: bash offers %v, want nothing", got)
	}
}

// zsh runs the same function through bashcompinit; zsh itself filters by
// the word typed, so only what is offered is checked.
func TestCompletionZsh(t *testing.T) {
	script := completionScript(t, "zsh")
	for _, tc := range completionCases {
		got := shellLines(t, "zsh", append([]string{"-f", "-c",
			`autoload -U compinit && compinit -u -D && source "$1" && shift && print -r -- "registered: $_comps[snapctl]" && ` +
				// As bashcompinit's compgen calls it: under emulate -L sh.
				`t() { emulate -L sh; COMP_WORDS=(snapctl "$@"); COMP_CWORD=$#; _snapctl; printf "%s\n" "${COMPREPLY[@]}"; } && t "$@"`,
			"zsh", script}, tc.words...)...)
		if len(got) == 0 || !strings.Contains(got[0], "-F _snapctl") {
			t.Fatalf("source <(snapctl completion zsh) registered no completion for snapctl: %v", got)
		}
		for _, w := range tc.want {
			if !slices.Contains(got[1:], w) {
				t.Errorf("snapctl %s<TAB>: zsh offers %v, want %q among them", strings.Join(tc.words, " "), got[1:], w)
			}
		}
	}
}

func TestCompletionFish(t *testing.T) {
	script := completionScript(t, "fish")
	for _, tc := range completionCases {
		line := "snapctl " + strings.Join(tc.words, " ")
		var got []string
		for _, l := range shellLines(t, "fish", "--no-config", "-c", `source $argv[1]; complete -C $argv[2]`, script, line) {
			word, _, _ := strings.Cut(l, "\t") // fish adds the description
			got = append(got, word)
		}
		for _, w := range tc.want {
			if !slices.Contains(got, w) {
				t.Errorf("%s<TAB>: fish offers %v, want %q among them", line, got, w)
			}
		}
	}
}

// Every command and every flag is in every script: they are read from the
// command table and the flag sets, not written twice.
func TestCompletionCoversEveryCommandAndFlag(t *testing.T) {
	s := &server{t: t, addr: closedPort(t)}
	scripts := map[string]string{}
	for _, sh := range []string{"bash", "zsh", "fish"} {
		scripts[sh] = s.wantExit(exitOK, "completion", sh).stdout
	}
	tree := completionTree()
	for _, cmd := range commands {
		for _, f := range tree.flags[cmd.name] {
			for sh, script := range scripts {
				if word := dashed(f); sh != "fish" && !strings.Contains(script, word) || sh == "fish" && !strings.Contains(script, "-l "+f.Name+" ") {
					t.Errorf("%s completion lacks %s's --%s", sh, cmd.name, f.Name)
				}
			}
		}
		last := cmd.name[strings.LastIndex(cmd.name, " ")+1:]
		for sh, script := range scripts {
			if !strings.Contains(script, last) {
				t.Errorf("%s completion lacks the command %q", sh, cmd.name)
			}
		}
	}
	for _, args := range [][]string{{"completion"}, {"completion", "tcsh"}} {
		if r := s.wantExit(exitUsage, args...); r.stdout != "" {
			t.Errorf("snapctl %v printed %q", args, r.stdout)
		}
	}
}
