//go:build race

package main

// Under -race the binary under test is built with -race too, so a race in
// the real process fails the test (it exits 66) rather than going unseen.
func init() { buildFlags = append(buildFlags, "-race") }
