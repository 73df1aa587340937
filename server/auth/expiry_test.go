package auth

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/snapcoord/snapcoord/internal/testkit/testpki"
)

// concat writes the files' contents, one after the other, to dir/name.
func concat(t *testing.T, dir, name string, files ...string) string {
	t.Helper()
	var data []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, b...)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The expiry the reloader reports is the first certificate to expire: in
// the served chain (an intermediate sent with the leaf counts) and among
// the client CAs of a bundle; a reload reports the new files'.
func TestTLSReloaderExpiryIsTheFirstToExpire(t *testing.T) {
	dir := t.TempDir()
	inTenDays := time.Now().Add(10 * 24 * time.Hour).Truncate(time.Second)
	serverCA, clientCA := testpki.NewCA(t, dir, "server-ca"), testpki.NewCA(t, dir, "client-ca")
	leaf := serverCA.IssueUntil(t, dir, "server", x509.ExtKeyUsageServerAuth, inTenDays)
	chain := concat(t, dir, "chain.pem", leaf.CertFile, serverCA.File) // the CA expires in an hour
	// A bundle whose first certificate outlives the second by ten days.
	longCA := clientCA.IssueUntil(t, dir, "long-lived", x509.ExtKeyUsageClientAuth, inTenDays)
	bundle := concat(t, dir, "client-cas.pem", longCA.CertFile, clientCA.File)

	r, err := NewTLSReloader(leaf.CertFile, leaf.KeyFile, bundle)
	if err != nil {
		t.Fatal(err)
	}
	want := Expiry{Server: inTenDays, ClientCA: clientCA.Cert.NotAfter}
	if got := r.Expiry(); !got.Server.Equal(want.Server) || !got.ClientCA.Equal(want.ClientCA) {
		t.Errorf("Expiry with the leaf alone = %+v, want %+v", got, want)
	}

	r.certFile = chain
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := r.Expiry().Server; !got.Equal(serverCA.Cert.NotAfter) {
		t.Errorf("Expiry().Server with an intermediate that expires first = %v, want the intermediate's %v", got, serverCA.Cert.NotAfter)
	}
}

// Without a client CA file there is no client CA expiry.
func TestTLSReloaderExpiryWithoutClientCA(t *testing.T) {
	dir := t.TempDir()
	leaf := testpki.NewCA(t, dir, "ca").Issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	r, err := NewTLSReloader(leaf.CertFile, leaf.KeyFile, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Expiry(); !got.Server.Equal(leaf.TLS.Leaf.NotAfter) || !got.ClientCA.IsZero() {
		t.Errorf("Expiry = %+v, want the leaf's %v and no client CA", got, leaf.TLS.Leaf.NotAfter)
	}
}
