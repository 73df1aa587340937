//go:build !race

package coordproc

// raceBuild: this program was built without -race; see race.go.
const raceBuild = false
