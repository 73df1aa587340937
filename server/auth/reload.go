package auth

import (
	"crypto/tls"
	"sync/atomic"
)

// TLSReloader serves TLS from files that may be replaced while the server
// runs: each handshake takes the configuration loaded last, through
// tls.Config.GetConfigForClient, so connections already open keep the
// material they were made with and new ones get the new.
type TLSReloader struct {
	certFile, keyFile, clientCAFile string
	current                         atomic.Pointer[tlsLoaded]
}

// tlsLoaded is one load of the files.
type tlsLoaded struct {
	cfg    *tls.Config
	expiry Expiry
}

// NewTLSReloader loads the files once, as ServerTLSConfig does.
func NewTLSReloader(certFile, keyFile, clientCAFile string) (*TLSReloader, error) {
	r := &TLSReloader{certFile: certFile, keyFile: keyFile, clientCAFile: clientCAFile}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload reads the certificate, key and client CA files again. On error
// (a key that does not match the certificate yet, a truncated file) the
// previous configuration stays in use.
func (r *TLSReloader) Reload() error {
	cfg, exp, err := ServerTLSConfig(r.certFile, r.keyFile, r.clientCAFile)
	if err != nil {
		return err
	}
	// The configuration GetConfigForClient returns replaces the one gRPC
	// set ALPN on, so it must offer h2 itself.
	cfg.NextProtos = []string{"h2"}
	r.current.Store(&tlsLoaded{cfg: cfg, expiry: exp})
	return nil
}

// Expiry is when the certificates in use expire: those loaded last.
func (r *TLSReloader) Expiry() Expiry { return r.current.Load().expiry }

// Config is the server's TLS configuration; hand it to credentials.NewTLS.
func (r *TLSReloader) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.current.Load().cfg, nil
		},
	}
}
