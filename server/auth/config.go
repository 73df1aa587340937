package auth

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"strings"
	"time"
)

// MinAdminTokenLength is the shortest admin token ReadAdminTokens accepts:
// a guessable token on a shared coordinator is worse than none, because it
// looks like protection.
const MinAdminTokenLength = 16

// ReadAdminTokens reads admin tokens from a file: one per line, surrounding
// whitespace ignored, blank lines and lines starting with # skipped. Several
// tokens are all valid, for rotation. Errors name lines, never tokens.
func ReadAdminTokens(path string) ([]string, error) {
	return readTokens(path, "admin", "an admin token")
}

// ReadViewerTokens reads viewer tokens from a file, by ReadAdminTokens'
// rules.
func ReadViewerTokens(path string) ([]string, error) {
	return readTokens(path, "viewer", "a viewer token")
}

// readTokens reads a token file; kind and noun name its tokens in errors.
func readTokens(path, kind, noun string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s token file: %w", kind, err)
	}
	var tokens []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		tok := strings.TrimSpace(sc.Text())
		if tok == "" || strings.HasPrefix(tok, "#") {
			continue
		}
		if err := checkToken(tok, noun); err != nil {
			return nil, fmt.Errorf("%s token file %s, line %d: %w", kind, path, line, err)
		}
		tokens = append(tokens, tok)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s token file %s: %w", kind, path, err)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("%s token file %s holds no token", kind, path)
	}
	return tokens, nil
}

// CheckAdminToken rejects tokens that are too short or contain whitespace.
func CheckAdminToken(tok string) error { return checkToken(tok, "an admin token") }

// checkToken applies the admin token rules to a token of any kind, named
// by noun: a guessable viewer token would show every run to anyone.
func checkToken(tok, noun string) error {
	switch {
	case strings.ContainsAny(tok, " \t\r\n"):
		return fmt.Errorf("%s must not contain whitespace", noun)
	case len(tok) < MinAdminTokenLength:
		return fmt.Errorf("%s must be at least %d characters long (try: openssl rand -hex 32)", noun, MinAdminTokenLength)
	}
	return nil
}

// ServerTLSConfig loads the server's certificate and key and, when
// clientCAFile is set, requires every client to present a certificate
// signed by one of the CAs in it (mutual TLS). The Expiry is what it loaded.
func ServerTLSConfig(certFile, keyFile, clientCAFile string) (*tls.Config, Expiry, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, Expiry{}, fmt.Errorf("load TLS certificate %s and key %s: %w", certFile, keyFile, err)
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
	}
	exp := Expiry{Server: chainExpiry(cert)}
	if clientCAFile != "" {
		pool, notAfter, err := loadCertPool(clientCAFile)
		if err != nil {
			return nil, Expiry{}, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		exp.ClientCA = notAfter
	}
	return cfg, exp, nil
}

// Expiry is when loaded certificates stop being valid, for the expiry
// metrics: the earliest NotAfter of the served chain (leaf and the
// intermediates sent with it: the first to expire breaks it) and of the
// client CAs (zero without any). An expiring CA in a bundle kept for a
// rotation still counts: clients whose certificates it signed fail then.
type Expiry struct {
	Server, ClientCA time.Time
}

// chainExpiry is the earliest NotAfter in cert's chain. LoadX509KeyPair
// parsed every certificate of it already, so none fails here.
func chainExpiry(cert tls.Certificate) time.Time {
	var first time.Time
	for _, der := range cert.Certificate {
		if c, err := x509.ParseCertificate(der); err == nil && (first.IsZero() || c.NotAfter.Before(first)) {
			first = c.NotAfter
		}
	}
	return first
}

// loadCertPool reads a PEM bundle of CAs, and the earliest NotAfter among
// them. Like x509.CertPool.AppendCertsFromPEM it skips blocks that are not
// certificates or do not parse, and fails only when none is left.
func loadCertPool(path string) (*x509.CertPool, time.Time, error) {
	rest, err := os.ReadFile(path)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("read client CA file: %w", err)
	}
	pool := x509.NewCertPool()
	var first time.Time
	for len(rest) > 0 {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			continue
		}
		pool.AddCert(c)
		if first.IsZero() || c.NotAfter.Before(first) {
			first = c.NotAfter
		}
	}
	if first.IsZero() {
		return nil, time.Time{}, fmt.Errorf("client CA file %s holds no PEM certificate", path)
	}
	return pool, first, nil
}
