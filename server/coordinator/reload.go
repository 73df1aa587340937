package coordinator

import (
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/snapcoord/snapcoord/server/auth"
	"github.com/snapcoord/snapcoord/server/telemetry"
)

// credentialReloader re-reads the admin and viewer token files and the TLS files when
// they change, so that a rotation needs no restart. Checking is a stat of
// each file (cheap: no read unless something changed) at every
// CredentialsCheckInterval, and a value on ReloadSignals (SIGHUP) reloads
// everything at once.
// Open connections and streams are untouched: a new certificate or client
// CA applies to the next handshake, new admin tokens to the next call.
type credentialReloader struct {
	cfg   Config
	authn *auth.Authenticator
	tls   *auth.TLSReloader // nil without TLS
	log   *slog.Logger
	tel   *telemetry.Telemetry

	seen map[string]os.FileInfo // by path, as last checked
}

func newCredentialReloader(cfg Config, authn *auth.Authenticator, tlsr *auth.TLSReloader, log *slog.Logger, tel *telemetry.Telemetry) *credentialReloader {
	r := &credentialReloader{cfg: cfg, authn: authn, tls: tlsr, log: log, tel: tel, seen: map[string]os.FileInfo{}}
	r.changed(r.tokenFiles())
	r.changed(r.viewerFiles())
	r.changed(r.tlsFiles())
	return r
}

func (r *credentialReloader) tokenFiles() []string  { return nonEmpty(r.cfg.AdminTokenFile) }
func (r *credentialReloader) viewerFiles() []string { return nonEmpty(r.cfg.ViewerTokenFile) }
func (r *credentialReloader) tlsFiles() []string {
	return nonEmpty(r.cfg.TLSCert, r.cfg.TLSKey, r.cfg.ClientCA)
}

func nonEmpty(paths ...string) []string {
	var out []string
	for _, p := range paths {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// changed stats paths and reports whether any differs from the last look
// (another file put in its place, a new size or modification time). A file
// that cannot be stat'ed counts as changed once, so its error is logged by
// the reload that follows.
func (r *credentialReloader) changed(paths []string) bool {
	diff := false
	for _, p := range paths {
		fi, err := os.Stat(p)
		old, ok := r.seen[p]
		switch {
		case err != nil:
			diff = diff || ok
			delete(r.seen, p)
		case !ok || !os.SameFile(old, fi) || !old.ModTime().Equal(fi.ModTime()) || old.Size() != fi.Size():
			diff = true
			r.seen[p] = fi
		}
	}
	return diff
}

// check reloads what changed on disk, or everything when forced (SIGHUP).
// A failed reload keeps the credentials in use, logs why and shows on
// /metrics (an alert reads it); the next change of the files tries again.
// The metrics change before the log line, which tests wait for.
func (r *credentialReloader) check(force bool) {
	if tokens := r.tokenFiles(); (r.changed(tokens) || force) && len(tokens) > 0 {
		if err := r.reloadTokens(); err != nil {
			r.log.Error("admin tokens not reloaded; the previous ones stay valid", "file", r.cfg.AdminTokenFile, "err", err)
		}
	}
	if files := r.viewerFiles(); (r.changed(files) || force) && len(files) > 0 {
		if err := r.reloadViewers(); err != nil {
			r.log.Error("viewer tokens not reloaded; the previous ones stay valid", "file", r.cfg.ViewerTokenFile, "err", err)
		}
	}
	if files := r.tlsFiles(); (r.changed(files) || force) && r.tls != nil {
		err := r.tls.Reload()
		r.tel.CredentialsReloaded(telemetry.CredentialsTLS, err)
		if err != nil {
			r.log.Error("TLS files not reloaded; the previous certificate, key and client CA stay in use", "err", err)
		} else {
			reportExpiry(r.tel, r.tls)
			r.log.Info("credentials reloaded", "what", "tls", "cert", r.cfg.TLSCert, "client_ca", r.cfg.ClientCA)
		}
	}
}

// reportExpiry puts when the certificates in use expire on /metrics, for
// the alert on a certificate about to expire.
func reportExpiry(tel *telemetry.Telemetry, tlsr *auth.TLSReloader) {
	exp := tlsr.Expiry()
	tel.CertificateExpiry(telemetry.CertificateServer, exp.Server)
	if !exp.ClientCA.IsZero() {
		tel.CertificateExpiry(telemetry.CertificateClientCA, exp.ClientCA)
	}
}

func (r *credentialReloader) reloadTokens() error {
	tokens, err := AdminTokens(r.cfg)
	if err == nil {
		err = r.authn.SetAdminTokens(tokens)
	}
	r.tel.CredentialsReloaded(telemetry.CredentialsAdminTokens, err)
	if err != nil {
		return err
	}
	r.log.Info("credentials reloaded", "what", "admin_tokens", "admin_tokens", len(tokens))
	return nil
}

func (r *credentialReloader) reloadViewers() error {
	tokens, err := ViewerTokens(r.cfg)
	if err != nil {
		return err
	}
	if err := r.authn.SetViewerTokens(tokens); err != nil {
		return err
	}
	r.log.Info("credentials reloaded", "what", "viewer_tokens", "viewer_tokens", len(tokens))
	return nil
}

// start checks at every tick (nil: never) and reloads everything at every
// hup, until the returned function is first called.
func (r *credentialReloader) start(tick <-chan time.Time, hup <-chan os.Signal) (stop func()) {
	return goUntilStopped(func(quit <-chan struct{}) {
		for {
			select {
			case <-quit:
				return
			case <-tick:
				r.check(false)
			case <-hup:
				r.log.Info("SIGHUP: reloading credentials")
				r.check(true)
			}
		}
	})
}

// startLoops starts the background loops that Shutdown stops: the health
// watch and the credential reload.
func (c *Coordinator) startLoops() {
	if c.eng != nil {
		// With etcd, a term whose engine fails ends instead (see leader.Election).
		ticker := time.NewTicker(healthPollInterval)
		stopHealth := startHealthWatch(c.eng, c.srv, ticker.C)
		c.defer_(func() {
			stopHealth()
			ticker.Stop()
		})
	}
	var tick <-chan time.Time
	var reloadTicker *time.Ticker
	if c.cfg.CredentialsCheckInterval > 0 {
		reloadTicker = time.NewTicker(c.cfg.CredentialsCheckInterval)
		tick = reloadTicker.C
	}
	stopReload := newCredentialReloader(c.cfg, c.authn, c.tlsr, c.log, c.tel).start(tick, c.cfg.ReloadSignals)
	c.defer_(func() {
		stopReload()
		if reloadTicker != nil {
			reloadTicker.Stop()
		}
	})
}

// healthPollInterval is how often the coordinator asks the engine whether
// it can still commit.
const healthPollInterval = time.Second

// startHealthWatch turns NOT_SERVING for good once the engine reports that
// a store commit failed. It stops when the returned function is first called.
func startHealthWatch(eng interface{ Healthy() error }, srv interface{ MarkUnhealthy(error) }, tick <-chan time.Time) (stop func()) {
	return goUntilStopped(func(quit <-chan struct{}) {
		for {
			select {
			case <-quit:
				return
			case <-tick:
				if err := eng.Healthy(); err != nil {
					srv.MarkUnhealthy(err)
					return
				}
			}
		}
	})
}

// goUntilStopped runs loop in a goroutine; the returned function, first
// called, closes loop's quit channel and waits for loop to return.
func goUntilStopped(loop func(quit <-chan struct{})) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		loop(quit)
	}()
	return sync.OnceFunc(func() {
		close(quit)
		<-done
	})
}
