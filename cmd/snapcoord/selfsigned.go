package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The files --tls-self-signed keeps in its directory. The directory is the
// job's state directory on shared storage: every node reads the CA
// certificate from it (SNAPCOORD_CA_FILE), and a restarted or requeued
// coordinator finds the CA again.
const (
	selfSignedCA      = "ca.pem"         // the CA certificate: what clients trust
	selfSignedCAKey   = "ca-key.pem"     // 0600: whoever holds it can impersonate the coordinator
	selfSignedCert    = "server.pem"     // this coordinator's certificate
	selfSignedKey     = "server-key.pem" // 0600
	selfSignedCAValid = 365 * 24 * time.Hour
	// A server certificate is made afresh at every start (the coordinator
	// may come back on another host), so it need not outlive a long job by
	// much; the CA must outlive it, or it is made anew.
	selfSignedCertValid = 90 * 24 * time.Hour
)

// selfSigned is what provisionSelfSigned made or found.
type selfSigned struct {
	CAFile, CertFile, KeyFile string
	CAReused                  bool
	Hosts                     []string // the names and addresses the certificate holds
}

// provisionSelfSigned makes (or reuses) a CA in dir and issues it a server
// certificate for this host: the --listen address (every interface's
// address for a wildcard), the host name, and loopback. The CA is reused
// while it stays valid for a whole server certificate's life, so that
// clients that loaded ca.pem keep trusting a restarted coordinator.
func provisionSelfSigned(dir, listen string, now time.Time) (selfSigned, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return selfSigned{}, fmt.Errorf("--tls-self-signed: %w", err)
	}
	out := selfSigned{CAFile: filepath.Join(dir, selfSignedCA), CertFile: filepath.Join(dir, selfSignedCert), KeyFile: filepath.Join(dir, selfSignedKey)}
	ca, caKey, err := loadCA(out.CAFile, filepath.Join(dir, selfSignedCAKey), now.Add(selfSignedCertValid))
	if err != nil {
		return selfSigned{}, err
	}
	out.CAReused = ca != nil
	if ca == nil {
		if ca, caKey, err = newCA(dir, now); err != nil {
			return selfSigned{}, err
		}
	}
	out.Hosts, err = certHosts(listen)
	if err != nil {
		return selfSigned{}, err
	}
	if err := issueServer(out, ca, caKey, now); err != nil {
		return selfSigned{}, err
	}
	return out, nil
}

// loadCA reads the CA in caFile and keyFile; nil, nil when there is none
// or it expires before validUntil. A CA that is there but unreadable is an
// error: replacing it would silently break every client that trusts it.
func loadCA(caFile, keyFile string, validUntil time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPEM, err := os.ReadFile(caFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-self-signed: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-self-signed: the CA certificate %s is there but not its key: %w", caFile, err)
	}
	cert, err := parsePEM(certPEM, "CERTIFICATE", x509.ParseCertificate)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-self-signed: %s: %w", caFile, err)
	}
	key, err := parsePEM(keyPEM, "PRIVATE KEY", x509.ParsePKCS8PrivateKey)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-self-signed: %s: %w", keyFile, err)
	}
	ecKey, ok := key.(*ecdsa.PrivateKey)
	if !ok || !ecKey.PublicKey.Equal(cert.PublicKey) {
		return nil, nil, fmt.Errorf("--tls-self-signed: %s is not the key of %s", keyFile, caFile)
	}
	if cert.NotAfter.Before(validUntil) {
		return nil, nil, nil
	}
	return cert, ecKey, nil
}

func parsePEM[T any](data []byte, kind string, parse func([]byte) (T, error)) (T, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != kind {
		var zero T
		return zero, fmt.Errorf("no PEM %s block", kind)
	}
	return parse(block.Bytes)
}

func newCA(dir string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	host, _ := os.Hostname()
	tmpl, err := certTemplate("snapcoord job CA "+host, now, selfSignedCAValid)
	if err != nil {
		return nil, nil, err
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.MaxPathLenZero = true, true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	cert, key, err := sign(tmpl, nil, nil)
	if err != nil {
		return nil, nil, err
	}
	// The key first: a CA certificate without its key would be refused at
	// the next start rather than replaced.
	if err := writeKey(filepath.Join(dir, selfSignedCAKey), key); err != nil {
		return nil, nil, err
	}
	if err := writeFileAtomic(filepath.Join(dir, selfSignedCA), pemBytes("CERTIFICATE", cert.Raw), 0o644); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

func issueServer(out selfSigned, ca *x509.Certificate, caKey *ecdsa.PrivateKey, now time.Time) error {
	tmpl, err := certTemplate("snapcoord "+out.Hosts[0], now, selfSignedCertValid)
	if err != nil {
		return err
	}
	tmpl.KeyUsage, tmpl.ExtKeyUsage = x509.KeyUsageDigitalSignature, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	for _, h := range out.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	cert, key, err := sign(tmpl, ca, caKey)
	if err != nil {
		return err
	}
	if err := writeKey(out.KeyFile, key); err != nil {
		return err
	}
	return writeFileAtomic(out.CertFile, pemBytes("CERTIFICATE", cert.Raw), 0o644)
}

// certHosts lists the names and addresses a client may dial: the --listen
// host (every interface's address when it is a wildcard), the host name,
// its short form, and loopback. The first is the certificate's subject.
func certHosts(listen string) ([]string, error) {
	var hosts []string
	add := func(h string) {
		for _, have := range hosts {
			if have == h {
				return
			}
		}
		hosts = append(hosts, h)
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("--tls-self-signed: --listen %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return nil, fmt.Errorf("--tls-self-signed: this host's addresses: %w", err)
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() {
				add(n.IP.String())
			}
		}
	} else {
		add(host)
	}
	if name, err := os.Hostname(); err == nil && name != "" {
		add(name)
		add(strings.SplitN(name, ".", 2)[0])
	}
	for _, h := range []string{"localhost", "127.0.0.1", "::1"} {
		add(h)
	}
	return hosts, nil
}

func certTemplate(cn string, now time.Time, valid time.Duration) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("--tls-self-signed: %w", err)
	}
	// An hour back: the clocks of the job's nodes may lag the batch host's.
	return &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(valid)}, nil
}

// sign makes a key for tmpl and signs it with parentKey (itself when nil).
func sign(tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-self-signed: %w", err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-self-signed: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-self-signed: %w", err)
	}
	return cert, key, nil
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("--tls-self-signed: %w", err)
	}
	return writeFileAtomic(path, pemBytes("PRIVATE KEY", der), 0o600)
}

func pemBytes(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

// writeFileAtomic writes through a temporary file created with perm, so a
// key is never readable by others, not even for a moment, and a reader on
// another node never sees half a certificate.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("--tls-self-signed: %w", err)
	}
	defer os.Remove(f.Name()) // a no-op once renamed
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("--tls-self-signed: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("--tls-self-signed: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--tls-self-signed: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("--tls-self-signed: %w", err)
	}
	return nil
}
