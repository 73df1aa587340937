//go:build race

package integration

// Under -race the snapcoord binary under test is built with -race too, so a
// data race in the real process fails the test (it exits 66) instead of
// going unseen.
func init() { buildFlags = append(buildFlags, "-race") }
