// Command snapuicheck is `make ui-check`: it starts a real coordinator,
// drives a small run through its deadline (one trainer rank, one
// environment worker answering interval and deadline snapshots), then
// keeps a live run going with a rank that fell behind, an environment
// worker gone silent and a failed snapshot, beside a run left pending past
// its B. It loads the status page in headless Chromium with a viewer
// token, saves screenshots, and checks what the browser rendered: the
// worker lanes and their flags, decisions newest first, the past-B flag,
// and the failed snapshot's red in the screenshot's pixels.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
)

// adminToken and viewerToken are this check's own: the page is checked
// with auth on, through the credential a browser is meant to hold.
const (
	adminToken  = "ui-check-0123456789abcdef0123456789"
	viewerToken = "ui-view-0123456789abcdef01234567890"
)

func main() {
	snapcoord := flag.String("snapcoord", "bin/snapcoord", "the snapcoord `binary`")
	chromium := flag.String("chromium", "chromium", "the Chromium `binary`")
	out := flag.String("out", ".cache/ui-check", "`directory` for the screenshots and DOM dumps")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("ui-check: ")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := check(ctx, *snapcoord, *chromium, *out); err != nil {
		log.Fatalf("FAIL: %v", err)
	}
	log.Printf("OK: screenshots in %s", *out)
}

func check(ctx context.Context, snapcoord, chromium, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "snapcoord-ui-check-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	viewers := filepath.Join(work, "viewer-tokens")
	if err := os.WriteFile(viewers, []byte(viewerToken+"\n"), 0o600); err != nil {
		return err
	}
	c, err := coordproc.Start(ctx, coordproc.Config{
		Bin: snapcoord, DataDir: filepath.Join(work, "data"), LogPath: filepath.Join(work, "coordinator.log"), Metrics: true,
		Env: []string{"SNAPCOORD_ADMIN_TOKEN=" + adminToken},
		Args: []string{"--log-format", "json", "--heartbeat-interval", "1s", "--lease-ttl", "5s",
			"--viewer-token-file", viewers},
	})
	if err != nil {
		return err
	}
	defer func() { _ = c.Stop(15 * time.Second) }()
	log.Printf("coordinator: gRPC %s, status page http://%s/", c.Addr, c.MetricsAddr)
	if err := driveRun(ctx, c.Addr, "ui-check"); err != nil {
		return fmt.Errorf("drive the run: %w\ncoordinator log:\n%s", err, c.Tail(40))
	}
	stop, err := liveRuns(ctx, c.Addr)
	if err != nil {
		return fmt.Errorf("the live runs: %w\ncoordinator log:\n%s", err, c.Tail(40))
	}
	defer stop()
	// Basic auth in the URL is how a headless browser can send it; the
	// page itself never takes the token from the URL.
	base := fmt.Sprintf("http://ui:%s@%s", viewerToken, c.MetricsAddr)
	b := browser{bin: chromium, profile: filepath.Join(work, "chromium")}
	for _, p := range pagesToCheck {
		if err := b.check(ctx, base+p.path, filepath.Join(out, p.name), p.size, p.checks); err != nil {
			return fmt.Errorf("%s: %w", p.path, err)
		}
	}
	return nil
}

// browser is headless Chromium with a throwaway profile and nothing that
// reaches beyond loopback.
type browser struct{ bin, profile string }

func (b browser) run(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
		"--user-data-dir=" + b.profile}
	cmd := exec.CommandContext(ctx, b.bin, append(base, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", b.bin, err, stderr.String())
	}
	return outb, nil
}

// check saves name.png and name.html of url and checks both.
func (b browser) check(ctx context.Context, url, name, size string, checks []pageCheck) error {
	png := name + ".png"
	_ = os.Remove(png)
	if _, err := b.run(ctx, "--window-size="+size, "--screenshot="+png, url); err != nil {
		return err
	}
	img, err := os.ReadFile(png)
	if err != nil {
		return fmt.Errorf("no screenshot: %w", err)
	}
	// A blank page of that size compresses to a few KiB; the timeline,
	// tables and text take far more.
	if !bytes.HasPrefix(img, []byte("\x89PNG\r\n\x1a\n")) || len(img) < 20<<10 {
		return fmt.Errorf("screenshot %s: %d bytes, want a PNG of at least 20 KiB", png, len(img))
	}
	dom, err := b.run(ctx, "--dump-dom", url)
	if err != nil {
		return err
	}
	if err := os.WriteFile(name+".html", dom, 0o644); err != nil {
		return err
	}
	shot, err := decodePNG(img)
	if err != nil {
		return fmt.Errorf("screenshot %s: %w", png, err)
	}
	for _, c := range checks {
		if err := c(string(dom), shot); err != nil {
			return fmt.Errorf("%w (DOM in %s.html, screenshot %s)", err, name, png)
		}
	}
	log.Printf("%s: %d-byte screenshot %s, DOM checked", url[strings.Index(url, "@")+1:], len(img), png)
	return nil
}
