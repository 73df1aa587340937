// Package testkit holds, in its subpackages, what tests and the
// development tools use to exercise snapcoord and nothing else does:
// coordproc (the snapcoord binary as a child process, and the one way
// tests build it), coordtest (the assembled coordinator inside a test
// process), etcdtest (a real etcd cluster on loopback), fakefollower (a
// coordinator that does not lead), spectest (the run specs tests create
// runs from), logsink (a log read while written) and testpki (throwaway
// certificate authorities).
//
// The rule: only _test.go files and the programs under tools/dev import
// these packages, so that no test kit ends up in snapcoord or snapctl.
// Production code shared by the binaries lives elsewhere under internal/.
// rule_test.go holds it.
package testkit
