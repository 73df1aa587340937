package coordinator

import (
	"crypto/tls"
	"fmt"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/snapcoord/snapcoord/server/leader"
)

// tlsConfig is the client TLS of CAFile, CertFile and KeyFile; nil when
// none is set (plaintext).
func (c EtcdConfig) tlsConfig() (*tls.Config, error) {
	if c.CAFile == "" && c.CertFile == "" {
		return nil, nil
	}
	info := transport.TLSInfo{TrustedCAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile}
	cfg, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcd TLS: %w", err)
	}
	return cfg, nil
}

// connectEtcd makes the etcd client. It does not wait for etcd: the
// election retries until it is reachable.
func (c *Coordinator) connectEtcd() error {
	tlsCfg, err := c.cfg.Etcd.tlsConfig()
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: c.cfg.Etcd.Endpoints,
		TLS:       tlsCfg,
		// A dead member is noticed well within an election TTL.
		DialKeepAliveTime:    time.Second,
		DialKeepAliveTimeout: time.Second,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	c.etcd = cli
	c.defer_(func() { _ = cli.Close() })
	return nil
}

// startElection campaigns, in the background until release, for the
// leadership of the group (see leader.Election); self is the address the
// others name as the leader's meanwhile.
func (c *Coordinator) startElection(self string) {
	page := c.cfg.advertisePage(c.metricsAddr)
	if !c.pageOn {
		page = ""
	}
	el := &leader.Election{
		Etcd: c.etcd, Prefix: c.cfg.Etcd.Prefix, Endpoints: c.cfg.Etcd.Endpoints, TTL: c.cfg.ElectionTTL,
		Gate: c.gate, Log: c.log, Page: page,
		LeaderPage: c.leaderPage.Store, Load: c.loadEngine, OnCommit: c.tel.OnCommit,
	}
	c.defer_(el.Start(self))
}
