package main

import (
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// completion prints the completion script for the shell args names. It
// is no entry of commands (its tree is read from them) and takes no flags.
func (c *cli) completion(args []string) error {
	if err := wantArgs(args, "SHELL"); err != nil {
		return err
	}
	t := completionTree()
	switch args[0] {
	case "bash":
		t.bash(c.stdout)
	case "zsh":
		// zsh runs the bash function through its bashcompinit: one script
		// to keep right.
		fmt.Fprint(c.stdout, "#compdef snapctl\n# zsh completion for snapctl: source <(snapctl completion zsh), after compinit\n"+
			"autoload -U +X bashcompinit && bashcompinit\n")
		t.bash(c.stdout)
	case "fish":
		t.fish(c.stdout)
	default:
		return usageErr(fmt.Errorf("completion %q: want bash, zsh or fish", args[0]))
	}
	return nil
}

// completions is what a shell completes, read from the command table and
// the commands' own flag sets, so that a new command or flag is completed
// without touching the scripts.
type completions struct {
	top    []string            // first words: commands and groups
	groups map[string][]string // group ("run") -> its second words
	flags  map[string][]*flag.Flag
	conn   []*flag.Flag // the connection flags, valid everywhere
}

func completionTree() completions {
	t := completions{groups: map[string][]string{}, flags: map[string][]*flag.Flag{}}
	for _, cmd := range commands {
		first, second, grouped := strings.Cut(cmd.name, " ")
		if !slices.Contains(t.top, first) {
			t.top = append(t.top, first)
		}
		if grouped {
			t.groups[first] = append(t.groups[first], second)
		}
		c := &cli{setFlags: map[string]bool{}}
		fs := c.newFlagSet("snapctl " + cmd.name)
		cmd.setup(fs, c)
		fs.VisitAll(func(f *flag.Flag) {
			if !connFlags[f.Name] {
				t.flags[cmd.name] = append(t.flags[cmd.name], f)
			}
		})
	}
	t.top = append(t.top, "completion", "version", "help")
	(&cli{}).newFlagSet("snapctl").VisitAll(func(f *flag.Flag) {
		if f.Name != "output" { // -o stands for both
			t.conn = append(t.conn, f)
		}
	})
	return t
}

// dashed is how the docs write a flag: -o, --addr.
func dashed(f *flag.Flag) string {
	if len(f.Name) == 1 {
		return "-" + f.Name
	}
	return "--" + f.Name
}

func takesValue(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

func flagWords(fs []*flag.Flag, keep func(*flag.Flag) bool) string {
	var w []string
	for _, f := range fs {
		if keep(f) {
			w = append(w, dashed(f))
		}
	}
	return strings.Join(w, " ")
}

func all(*flag.Flag) bool { return true }

// bash writes the function. It finds the command among the words (skipping
// flags and their values; bash splits --flag=value at "="), then offers
// the command's flags after a dash, -o's formats, or the next word of the
// command. Elsewhere (a RUN_ID, a file) it offers nothing, and bash's
// default completion (file names) applies.
func (t completions) bash(w io.Writer) {
	var valued []string
	for _, fs := range append([][]*flag.Flag{t.conn}, mapValues(t.flags)...) {
		for _, f := range fs {
			if takesValue(f) && !slices.Contains(valued, dashed(f)) {
				valued = append(valued, dashed(f))
			}
		}
	}
	groups := slices.Sorted(maps.Keys(t.groups))
	fmt.Fprintf(w, `# bash completion for snapctl: source <(snapctl completion bash)
_snapctl() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    local valued=" %s "
    local groups=" %s "
    local cmd="" i w words
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        case $w in
        --) break ;;
        =) ((i++)) ;;
        -*=*) ;;
        -*) [[ $valued == *" $w "* && ${COMP_WORDS[i+1]} != "=" ]] && ((i++)) ;;
        *)
            if [[ -z $cmd ]]; then
                cmd=$w
            elif [[ $groups == *" $cmd "* ]]; then
                cmd="$cmd $w"
            fi
            ;;
        esac
    done
    [[ $prev == "=" ]] && prev=${COMP_WORDS[COMP_CWORD-2]}
    case $prev in
    -o | --o | -output | --output)
        COMPREPLY=($(compgen -W "table json env" -- "$cur"))
        return
        ;;
    esac
    [[ $valued == *" $prev "* ]] && return
    if [[ $cur == -* ]]; then
        case $cmd in
`, strings.Join(valued, " "), strings.Join(groups, " "))
	for _, cmd := range commands {
		fmt.Fprintf(w, "        %q) words=%q ;;\n", cmd.name, flagWords(t.flags[cmd.name], all))
	}
	fmt.Fprintf(w, `        esac
        [[ -z $cmd ]] && words="--version"
        COMPREPLY=($(compgen -W "$words %s --help" -- "$cur"))
        return
    fi
    case $cmd in
    "") words=%q ;;
`, flagWords(t.conn, all), strings.Join(t.top, " "))
	for _, g := range groups {
		fmt.Fprintf(w, "    %q) words=%q ;;\n", g, strings.Join(t.groups[g], " "))
	}
	fmt.Fprint(w, `    completion) words="bash zsh fish" ;;
    *) return ;;
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _snapctl snapctl
`)
}

func mapValues(m map[string][]*flag.Flag) [][]*flag.Flag {
	var out [][]*flag.Flag
	for _, cmd := range commands {
		out = append(out, m[cmd.name])
	}
	return out
}

// fish writes complete commands: the connection flags everywhere, each
// command where no command is yet, a group's commands after the group,
// and each command's flags after it. Flags that take a file complete
// files; other values nothing.
func (t completions) fish(w io.Writer) {
	fmt.Fprint(w, "# fish completion for snapctl: snapctl completion fish | source\ncomplete -c snapctl -f\n")
	for _, f := range t.conn {
		fmt.Fprintf(w, "complete -c snapctl %s\n", fishFlag(f))
	}
	summaries := map[string]string{"completion": "print a shell completion script: bash, zsh or fish",
		"version": "print the version and commit", "help": "print the help"}
	for _, cmd := range commands {
		summaries[cmd.name] = cmd.summary
	}
	for _, top := range t.top {
		desc := summaries[top]
		if len(t.groups[top]) > 0 {
			desc = top + " commands: " + strings.Join(t.groups[top], ", ")
		}
		fmt.Fprintf(w, "complete -c snapctl -n __fish_use_subcommand -a %s -d %s\n", top, fishQuote(desc))
	}
	for _, g := range slices.Sorted(maps.Keys(t.groups)) {
		subs := t.groups[g]
		for _, sub := range subs {
			fmt.Fprintf(w, "complete -c snapctl -n %s -a %s -d %s\n",
				fishQuote("__fish_seen_subcommand_from "+g+"; and not __fish_seen_subcommand_from "+strings.Join(subs, " ")),
				sub, fishQuote(summaries[g+" "+sub]))
		}
	}
	for _, cmd := range commands {
		last := cmd.name[strings.LastIndex(cmd.name, " ")+1:]
		for _, f := range t.flags[cmd.name] {
			fmt.Fprintf(w, "complete -c snapctl -n %s %s\n", fishQuote("__fish_seen_subcommand_from "+last), fishFlag(f))
		}
	}
	fmt.Fprint(w, "complete -c snapctl -n '__fish_seen_subcommand_from completion' -a 'bash zsh fish'\n")
}

// fishFlag is the options of one flag's complete line: its name, whether
// it takes a value (a file: -r, which completes files; else -x), and its
// usage as the description.
func fishFlag(f *flag.Flag) string {
	name := "-l " + f.Name
	if len(f.Name) == 1 {
		name = "-s " + f.Name + " -l output"
	}
	kind, usage := flag.UnquoteUsage(f)
	switch {
	case f.Name == "o":
		name += " -x -a 'table json env'"
	case !takesValue(f):
	case kind == "file" || kind == "directory":
		name += " -r"
	default:
		name += " -x"
	}
	return name + " -d " + fishQuote(usage)
}

func fishQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
