package main

import (
	"context"
	"errors"

	"github.com/snapcoord/snapcoord/client"
)

// dial connects with the admin token of --token or --token-file, and with
// runToken for WorkerService calls (the sidecar's).
func (c *cli) dial(runToken string) (*client.Client, error) {
	admin, err := c.adminToken()
	if err != nil {
		return nil, err
	}
	opts := []client.Option{client.WithToken(admin), client.WithRunToken(runToken)}
	tls := client.TLS{CAFile: c.conn.caFile, CertFile: c.conn.certFile, KeyFile: c.conn.keyFile, ServerName: c.conn.serverName}
	switch {
	case c.conn.plaintext && tls != (client.TLS{}):
		return nil, usageErr(errors.New("--plaintext excludes --ca-file, --cert-file, --key-file and --server-name"))
	case c.conn.plaintext:
		opts = append(opts, client.WithInsecure())
	default:
		opts = append(opts, client.WithTLS(tls))
	}
	cl, err := client.Dial(c.conn.addr, opts...)
	if err != nil {
		return nil, withExit(exitInvalid, err)
	}
	return cl, nil
}

func (c *cli) adminToken() (string, error) {
	switch {
	case c.conn.token != "" && c.conn.tokenFile != "":
		return "", usageErr(errors.New("give --token or --token-file, not both"))
	case c.conn.tokenFile != "":
		tok, err := client.ReadTokenFile(c.conn.tokenFile)
		if err != nil {
			return "", withExit(exitInvalid, err)
		}
		return tok, nil
	}
	return c.conn.token, nil
}

// call bounds one call (with its retries) by --timeout.
func (c *cli) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.conn.timeout)
}
