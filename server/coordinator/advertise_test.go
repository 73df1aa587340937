package coordinator

import "testing"

// The status page address a coordinator publishes for the others' pages
// to redirect to: --advertise-http as given (a URL, or host:port made
// http://), else the metrics listener's resolved address when others can
// reach it, else none (a wildcard listener names no host).
func TestAdvertisePage(t *testing.T) {
	for _, tc := range []struct {
		http, listen, addr, want string
	}{
		{"https://coord-1.example/snapcoord/", "127.0.0.1:0", "127.0.0.1:4100", "https://coord-1.example/snapcoord"},
		{"coord-1.example:7071", "0.0.0.0:7071", "0.0.0.0:7071", "http://coord-1.example:7071"},
		{"", "127.0.0.1:0", "127.0.0.1:4100", "http://127.0.0.1:4100"},
		{"", "0.0.0.0:7071", "[::]:7071", ""},
		{"", "", "", ""},
	} {
		if got := (Config{AdvertiseHTTP: tc.http, MetricsListen: tc.listen}).advertisePage(tc.addr); got != tc.want {
			t.Errorf("--advertise-http %q, --metrics-listen %q at %q: %q, want %q", tc.http, tc.listen, tc.addr, got, tc.want)
		}
	}
}
