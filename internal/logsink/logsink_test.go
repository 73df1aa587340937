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
