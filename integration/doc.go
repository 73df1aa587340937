// Package integration holds snapcoord's delivery and durability tests: real
// gRPC servers (in-process, or the snapcoord binary as a child process that
// is SIGKILLed and restarted) on real bbolt files, driven over loopback with
// the generated snapcoord.v1 stubs. It has no code of its own outside tests.
//
// Run them with the race detector, as CI does:
//
//	go test -race -count=3 ./integration/
package integration
