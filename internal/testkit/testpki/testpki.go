// Package testpki makes throwaway certificate authorities and certificates
// for TLS tests, with their PEM files.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority valid for an hour either side of now.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	Pool *x509.CertPool // holds Cert
	File string         // Cert as PEM
}

// NewCA makes a CA and writes its certificate to dir/<name>.pem.
func NewCA(t testing.TB, dir, name string) *CA {
	t.Helper()
	tmpl := template(name)
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	cert, key := sign(t, tmpl, nil, nil)
	ca := &CA{Cert: cert, Key: key, Pool: x509.NewCertPool(), File: filepath.Join(dir, name+".pem")}
	ca.Pool.AddCert(cert)
	writePEM(t, ca.File, "CERTIFICATE", cert.Raw)
	return ca
}

// Leaf is a certificate a CA issued, and its PEM files.
type Leaf struct {
	TLS               tls.Certificate
	CertFile, KeyFile string
}

// Issue signs a certificate for hosts (IP addresses or DNS names; default
// 127.0.0.1 and localhost) with the given usage, and writes it to
// dir/<name>.pem and its key to dir/<name>-key.pem.
func (ca *CA) Issue(t testing.TB, dir, name string, usage x509.ExtKeyUsage, hosts ...string) Leaf {
	t.Helper()
	return ca.IssueUntil(t, dir, name, usage, time.Now().Add(time.Hour), hosts...)
}

// IssueUntil is Issue with a certificate valid until notAfter (which X.509
// keeps to the second).
func (ca *CA) IssueUntil(t testing.TB, dir, name string, usage x509.ExtKeyUsage, notAfter time.Time, hosts ...string) Leaf {
	t.Helper()
	tmpl := template(name)
	tmpl.NotAfter = notAfter
	tmpl.KeyUsage, tmpl.ExtKeyUsage = x509.KeyUsageDigitalSignature, []x509.ExtKeyUsage{usage}
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1", "localhost"}
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	cert, key := sign(t, tmpl, ca.Cert, ca.Key)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	l := Leaf{TLS: tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert},
		CertFile: filepath.Join(dir, name+".pem"), KeyFile: filepath.Join(dir, name+"-key.pem")}
	writePEM(t, l.CertFile, "CERTIFICATE", cert.Raw)
	writePEM(t, l.KeyFile, "PRIVATE KEY", keyDER)
	return l
}

func template(name string) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
	}
}

// sign makes a key and signs tmpl with parent, or with itself when parent
// is nil.
func sign(t testing.TB, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
