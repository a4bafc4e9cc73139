// Package securekafka starts, for tests, an in-process Kafka broker (kfake)
// that a production client must reach as a real secured cluster: over TLS
// with a throwaway CA, authenticated by SASL SCRAM, authorised by ACLs. A
// superuser administers it and one user gets only the grants the test
// gives, so a refusal is Kafka's own answer.
package securekafka

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/internal/testutil/testcerts"
)

// The superuser every Broker has.
const (
	AdminUser     = "admin"
	AdminPassword = "admin-secret"
)

// Options says what broker to start.
type Options struct {
	// Mechanism is the SCRAM mechanism of every user
	// (kafkasec.MechanismSCRAMSHA256 or kafkasec.MechanismSCRAMSHA512).
	Mechanism string
	// User and Password are the user under test; Grants are its ACLs.
	User, Password string
	Grants         []kfake.ACL
	// Cluster are further kfake options (the topics to seed).
	Cluster []kfake.Opt
	// AdminClient are further franz-go options of the superuser's client.
	AdminClient []kgo.Opt
}

// Broker is a running secured broker, closed when the test ends.
type Broker struct {
	// Addr is the broker's host:port.
	Addr string
	// CA signed the broker's certificate; CA.File is its PEM file.
	CA *testcerts.CA
	// Accepts counts the connections the broker accepted.
	Accepts atomic.Int64
	// AdminClient and Admin act as the superuser.
	AdminClient *kgo.Client
	Admin       *kadm.Client

	opts Options
}

// Start starts a broker as o says, on 127.0.0.1, and fails the test when
// it cannot.
func Start(tb testing.TB, o Options) *Broker {
	tb.Helper()
	ca, err := testcerts.NewCA(tb.TempDir(), o.User)
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := ca.Server("broker")
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	b := &Broker{Addr: ln.Addr().String(), CA: ca, opts: o}
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1),
		kfake.ListenFn(func(string, string) (net.Listener, error) { return CountingListener{ln, &b.Accepts}, nil }),
		kfake.TLS(testcerts.ServerTLS(srv, nil)), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(o.Mechanism, AdminUser, AdminPassword),
		kfake.User(o.Mechanism, o.User, o.Password, o.Grants...),
	}, o.Cluster...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	b.AdminClient, err = kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(b.Addr)}, o.AdminClient...),
		Kgo(b.Settings(tb, AdminUser, AdminPassword))...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(b.AdminClient.Close)
	b.Admin = kadm.NewClient(b.AdminClient)
	return b
}

// Settings are the client settings of user with password over the
// broker's TLS, as outboxd resolves them from its configuration.
func (b *Broker) Settings(tb testing.TB, user, password string) kafkasec.Settings {
	tb.Helper()
	cfg := kafkasec.Config{TLS: kafkasec.TLSConfig{CAFile: b.CA.File},
		SASL: kafkasec.SASLConfig{Mechanism: b.opts.Mechanism, User: user}}
	st, err := cfg.Resolve(func(k string) string {
		if k == kafkasec.EnvPassword {
			return password
		}
		return ""
	})
	if err != nil {
		tb.Fatal(err)
	}
	return st
}

// Grant gives the user under test what acls says, as an operator would
// while the client runs.
func (b *Broker) Grant(tb testing.TB, acls *kadm.ACLBuilder) {
	tb.Helper()
	res, err := b.Admin.CreateACLs(context.Background(), acls.Allow("User:"+b.opts.User))
	for _, r := range res {
		if err == nil {
			err = r.Err
		}
	}
	if err != nil {
		tb.Fatal(err)
	}
}

// ACL allows op on the resource of type rt named name (a literal name).
func ACL(rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) kfake.ACL {
	return kfake.ACL{Resource: rt, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
}

// CountingListener counts in N the connections it accepts: how a test
// tells that a client backs off instead of reconnecting at once.
type CountingListener struct {
	net.Listener
	N *atomic.Int64
}

// Accept accepts a connection and counts it.
func (l CountingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.N.Add(1)
	}
	return c, err
}
