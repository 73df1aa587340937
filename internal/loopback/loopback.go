// Package loopback tells whether an address stays on this host: the
// coordinator refuses to expose an open RunService elsewhere, and snapctl
// talks plaintext to such an address unless told to use TLS.
package loopback

import (
	"net"
	"strings"
)

// Is reports whether addr ("host:port") is on a loopback address:
// 127.0.0.0/8, ::1 or localhost. An empty host (all interfaces) or any
// other name is not.
func Is(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	host, _, _ = strings.Cut(host, "%") // a zone, as in fe80::1%eth0
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
