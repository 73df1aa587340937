package main

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/loopback"
)

// dial connects with the admin token of --token or --token-file, and with
// runToken for WorkerService calls (the sidecar's).
func (c *cli) dial(runToken string) (*client.Client, error) {
	return c.dialAddr(c.conn.addr, runToken, client.WithDialOptions(grpc.WithChainUnaryInterceptor(c.lastUnavailable.record)))
}

// dialAddr is dial to addr (one address, or a list), with extra options.
func (c *cli) dialAddr(addr, runToken string, extra ...client.Option) (*client.Client, error) {
	admin, err := c.adminToken()
	if err != nil {
		return nil, err
	}
	transport, err := c.transport()
	if err != nil {
		return nil, err
	}
	cl, err := client.Dial(addr, append([]client.Option{client.WithToken(admin), client.WithRunToken(runToken), transport}, extra...)...)
	if err != nil {
		return nil, withExit(exitInvalid, err)
	}
	return cl, nil
}

// transport is plaintext or TLS. --plaintext on the command line overrides
// TLS variables, and a TLS flag overrides SNAPCOORD_PLAINTEXT. Told
// neither, snapctl talks plaintext to a loopback address, as `snapcoord
// serve` listens there by default, and TLS to any other.
func (c *cli) transport() (client.Option, error) {
	plain := c.conn.plaintext
	tlsFlags := c.tlsFlagsInUse()
	if plain && len(tlsFlags) > 0 {
		var err error
		plain, err = c.settle([]string{"plaintext"}, tlsFlags, "--plaintext excludes --ca-file, --cert-file, --key-file and --server-name")
		if err != nil {
			return nil, err
		}
	}
	if !plain && len(tlsFlags) == 0 && !c.plaintextChosen() && allLoopback(client.Addrs(c.conn.addr)) {
		plain, c.conn.plainByDefault = true, true
	}
	c.conn.plainInUse = plain
	if plain {
		return client.WithInsecure(), nil
	}
	return client.WithTLS(client.TLS{CAFile: c.conn.caFile, CertFile: c.conn.certFile, KeyFile: c.conn.keyFile, ServerName: c.conn.serverName}), nil
}

// allLoopback: every address of the list is on this host.
func allLoopback(addrs []string) bool {
	for _, a := range addrs {
		if !loopback.Is(a) {
			return false
		}
	}
	return len(addrs) > 0
}

// plaintextChosen: --plaintext or SNAPCOORD_PLAINTEXT was given, either
// way (--plaintext=false asks for TLS on a loopback address).
func (c *cli) plaintextChosen() bool {
	v, ok := c.lookup(envNames["plaintext"])
	return c.setFlags["plaintext"] || ok && v != ""
}

// tlsFlagsInUse names the TLS flags with a value, from either source.
func (c *cli) tlsFlagsInUse() []string {
	var names []string
	for _, f := range []struct{ name, value string }{
		{"ca-file", c.conn.caFile}, {"cert-file", c.conn.certFile}, {"key-file", c.conn.keyFile}, {"server-name", c.conn.serverName},
	} {
		if f.value != "" {
			names = append(names, f.name)
		}
	}
	return names
}

// adminToken is --token's, or the one in --token-file.
func (c *cli) adminToken() (string, error) {
	return c.pickToken("token", c.conn.token, "token-file", c.conn.tokenFile)
}

// pickToken is the token of flag tokenFlag, or the one in the file of flag
// fileFlag. Given both, a flag on the command line overrides the other's
// variable: SNAPCOORD_TOKEN_FILE exported must not make --token fail.
func (c *cli) pickToken(tokenFlag, token, fileFlag, file string) (string, error) {
	fromFile := file != ""
	if fromFile && token != "" {
		var err error
		fromFile, err = c.settle([]string{fileFlag}, []string{tokenFlag}, fmt.Sprintf("give --%s or --%s, not both", tokenFlag, fileFlag))
		if err != nil {
			return "", err
		}
	}
	if !fromFile {
		return token, nil
	}
	tok, err := client.ReadTokenFile(file)
	if err != nil {
		return "", withExit(exitInvalid, err)
	}
	return tok, nil
}

// call bounds one call (with its retries) by --timeout.
func (c *cli) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.conn.timeout)
}
