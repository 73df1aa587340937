package loopback

import "testing"

func TestIs(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7070": true, "127.9.9.9:1": true, "[::1]:7070": true, "localhost:7070": true, "LOCALHOST:1": true,
		"0.0.0.0:7070": false, ":7070": false, "[::]:7070": false, "10.0.0.1:7070": false, "coordinator.example:7070": false,
		"127.0.0.1":             false, // no port: not an address snapctl or serve can use
		"dns:///localhost:7070": false,
	} {
		if got := Is(addr); got != want {
			t.Errorf("Is(%q) = %v, want %v", addr, got, want)
		}
	}
}
