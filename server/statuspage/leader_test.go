package statuspage_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/snapcoord/snapcoord/server/auth"
	"github.com/snapcoord/snapcoord/server/statuspage"
)

// A follower's page sends the reader to the same page on the leader, at
// the address the leader published for its page (never its gRPC address);
// while no coordinator leads, or the leader published no page address, it
// says so and reloads itself. Admission comes first: the redirect is no
// way around the token.
func TestFollowerPageSendsToTheLeadersPage(t *testing.T) {
	var leader statuspage.Leader
	page := statuspage.New(statuspage.Options{Runs: nil, Admit: allow{}, Leader: func() statuspage.Leader { return leader }})
	get := func(path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		page.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec
	}

	leader = statuspage.Leader{Known: true, PageURL: "http://coord-b.example:7071"}
	rec := get("/runs/r1")
	if rec.Code != http.StatusTemporaryRedirect || rec.Header().Get("Location") != "http://coord-b.example:7071/runs/r1" {
		t.Fatalf("follower, leader known: %d Location %q; want 307 to the leader's /runs/r1", rec.Code, rec.Header().Get("Location"))
	}

	leader = statuspage.Leader{}
	rec = get("/")
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "electing a leader") || rec.Header().Get("Refresh") == "" {
		t.Fatalf("follower, no leader: %d %q (Refresh %q); want 503 saying a leader is being elected, reloading", rec.Code, rec.Body.String(), rec.Header().Get("Refresh"))
	}

	leader = statuspage.Leader{Known: true}
	rec = get("/")
	if body := rec.Body.String(); rec.Code != http.StatusServiceUnavailable || !strings.Contains(body, "publishes no status page address") || strings.Contains(body, "restart") {
		t.Fatalf("follower, leader without a page: %d %q; want 503 saying the leader publishes no page address", rec.Code, body)
	}
}

func TestFollowerPageAdmitsBeforeRedirecting(t *testing.T) {
	w := newWorld(t)
	authn, err := auth.New(auth.Options{ViewerTokens: []string{viewerToken}, Runs: w.eng})
	if err != nil {
		t.Fatal(err)
	}
	page := statuspage.New(statuspage.Options{Runs: w.eng, Admit: authn, Leader: func() statuspage.Leader {
		return statuspage.Leader{Known: true, PageURL: "http://coord-b.example:7071"}
	}})
	rec := httptest.NewRecorder()
	page.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusUnauthorized {
		t.Fatalf("a follower's page without a token: %d; want 401", rec.Code)
	}
}
