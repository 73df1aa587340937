package auth

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
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
// signed by one of the CAs in it (mutual TLS).
func ServerTLSConfig(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate %s and key %s: %w", certFile, keyFile, err)
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
	}
	if clientCAFile != "" {
		pool, err := loadCertPool(clientCAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

func loadCertPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read client CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("client CA file %s holds no PEM certificate", path)
	}
	return pool, nil
}
