//go:build race

package coordproc

// raceBuild: this program was built with -race, as `make test` builds the
// tests; the binaries it builds for them are built with -race too.
const raceBuild = true
