package main

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

const (
	viewerToken  = "viewer-0123456789abcdef012345678"
	viewerToken2 = "viewer-rotated-fedcba9876543210f"
)

// pageGet fetches path from the metrics listener with the token as HTTP
// basic auth's password, as a browser sends it after its prompt (no
// token: no Authorization header).
func pageGet(t *testing.T, c *served, path, token string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+c.metricsAddr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.SetBasicAuth("someone", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	_ = resp.Body.Close()
	return resp
}

// A viewer token from --viewer-token-file opens the status page in a
// browser (basic auth: a 401 with a challenge first) and /metrics, but
// changes nothing: the gRPC API refuses it, with or without admin tokens.
// A rotated file is picked up without a restart.
func TestViewerTokenOpensOnlyTheStatusPage(t *testing.T) {
	file := filepath.Join(t.TempDir(), "viewer-tokens")
	writeTokens(t, file, viewerToken)
	c := startCoordinator(t, map[string]string{adminTokenEnv: adminToken},
		"--viewer-token-file", file, "--credentials-check-interval", "10ms")

	resp := pageGet(t, c, "/", "")
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic realm=") {
		t.Errorf("GET / without credentials: %d, WWW-Authenticate %q; want 401 with a basic-auth challenge",
			resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	for path, want := range map[string]int{"/": http.StatusOK, "/runs/none": http.StatusNotFound, "/metrics": http.StatusOK} {
		if got := pageGet(t, c, path, viewerToken).StatusCode; got != want {
			t.Errorf("GET %s with the viewer token: %d, want %d", path, got, want)
		}
	}
	if got := pageGet(t, c, "/", "viewer-not-a-token-of-this-one").StatusCode; got != http.StatusUnauthorized {
		t.Errorf("GET / with an unknown token: %d, want 401", got)
	}

	conn := dialWith(t, c.addr, nil)
	runs, workers := v1.NewRunServiceClient(conn), v1.NewWorkerServiceClient(conn)
	asViewer := bearer(t.Context(), viewerToken)
	_, err := runs.CreateRun(asViewer, &v1.CreateRunRequest{RunId: "by-viewer", Spec: runSpec(1)})
	wantCode(t, "CreateRun with the viewer token", err, codes.PermissionDenied)
	_, err = runs.GetRun(asViewer, &v1.GetRunRequest{RunId: "by-viewer"})
	wantCode(t, "GetRun with the viewer token", err, codes.PermissionDenied)
	_, err = workers.RegisterWorker(asViewer, &v1.RegisterWorkerRequest{RunId: "by-viewer", Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-0"})
	wantCode(t, "RegisterWorker with the viewer token", err, codes.PermissionDenied)
	if _, err := runs.GetRun(bearer(t.Context(), adminToken), &v1.GetRunRequest{RunId: "by-viewer"}); err == nil {
		t.Error("the run a viewer token tried to create exists")
	}

	next := c.logs.Next("credentials reloaded", "viewer_tokens")
	writeTokens(t, file, viewerToken2)
	reloaded(t, "the rotated viewer token file", next)
	if got := pageGet(t, c, "/", viewerToken2).StatusCode; got != http.StatusOK {
		t.Errorf("GET / with the new viewer token: %d, want 200", got)
	}
	if got := pageGet(t, c, "/", viewerToken).StatusCode; got != http.StatusUnauthorized {
		t.Errorf("GET / with the removed viewer token: %d, want 401", got)
	}
	if strings.Contains(c.logs.String(), viewerToken) || strings.Contains(c.logs.String(), viewerToken2) {
		t.Error("the log quotes a viewer token")
	}
}

// Without admin tokens RunService is open, yet a viewer token sent to it is
// still refused (it is meant to change nothing), while the page asks for it.
func TestViewerTokenRefusedByAnOpenRunService(t *testing.T) {
	file := filepath.Join(t.TempDir(), "viewer-tokens")
	writeTokens(t, file, viewerToken)
	c := startCoordinator(t, nil, "--viewer-token-file", file)
	runs := v1.NewRunServiceClient(dialWith(t, c.addr, nil))
	_, err := runs.CreateRun(bearer(t.Context(), viewerToken), &v1.CreateRunRequest{RunId: "by-viewer", Spec: runSpec(1)})
	wantCode(t, "CreateRun with the viewer token, no admin token configured", err, codes.PermissionDenied)
	if got := pageGet(t, c, "/", "").StatusCode; got != http.StatusUnauthorized {
		t.Errorf("GET / without credentials while a viewer token is configured: %d, want 401", got)
	}
	if got := pageGet(t, c, "/", viewerToken).StatusCode; got != http.StatusOK {
		t.Errorf("GET / with the viewer token: %d, want 200", got)
	}
}
