package logsink

import "testing"

// The serving line is found when it arrives in pieces, and reported once.
func TestWatcherReportsServingOnce(t *testing.T) {
	w := NewWatcher()
	for _, p := range []string{`{"msg":"starting"}` + "\n" + `{"msg":"serv`, `ing","addr":"127.0.0.1:7070"}` + "\n", `{"msg":"serving","addr":"x"}` + "\n"} {
		if _, err := w.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case addr := <-w.Serving():
		if addr != "127.0.0.1:7070" {
			t.Fatalf("serving at %q, want 127.0.0.1:7070", addr)
		}
	default:
		t.Fatal("the serving line was not reported")
	}
	select {
	case addr := <-w.Serving():
		t.Fatalf("reported twice (%q)", addr)
	default:
	}
	if got := w.String(); got != `{"msg":"starting"}`+"\n"+`{"msg":"serving","addr":"127.0.0.1:7070"}`+"\n"+`{"msg":"serving","addr":"x"}`+"\n" {
		t.Fatalf("log %q", got)
	}
}

// Next answers the first matching line written after it was called, by
// message and, when given, by "what"; earlier and other lines do not count.
func TestWatcherNextAnswersOnlyALaterMatchingLine(t *testing.T) {
	w := NewWatcher()
	write := func(line string) {
		t.Helper()
		if _, err := w.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"msg":"credentials reloaded","what":"tls"}`)
	tls, tokens, any := w.Next("credentials reloaded", "tls"), w.Next("credentials reloaded", "admin_tokens"), w.Next("credentials reloaded", "")
	closed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	if closed(tls) || closed(tokens) || closed(any) {
		t.Fatal("a line written before Next answered it")
	}
	write(`{"msg":"something else","what":"tls"}`)
	write(`{"msg":"credentials reloaded","what":"admin_tokens"}`)
	if closed(tls) || !closed(tokens) || !closed(any) {
		t.Fatalf("after an admin_tokens reload: tls %v (want false), admin_tokens %v, any %v (want true)", closed(tls), closed(tokens), closed(any))
	}
	write(`{"msg":"credentials reloaded","what":"tls"}`)
	if !closed(tls) {
		t.Fatal("the tls reload did not answer")
	}
}
