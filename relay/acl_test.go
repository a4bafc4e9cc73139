package relay

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/securekafka"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// secured is a kfake broker with TLS, SASL SCRAM-SHA-512 and ACLs: a
// superuser "admin" and the relay's user "relay", whose grants the test
// sets.
type secured struct{ *securekafka.Broker }

const (
	relayUser     = "relay"
	relayPassword = "relay-secret"
	aclTxnID      = "tx-1"
	aclTopic      = "out"
)

func startSecured(t *testing.T, grants ...kfake.ACL) *secured {
	t.Helper()
	return &secured{securekafka.Start(t, securekafka.Options{
		Mechanism: kafkasec.MechanismSCRAMSHA512, User: relayUser, Password: relayPassword, Grants: grants,
		Cluster: []kfake.Opt{kfake.SeedTopics(3, aclTopic), kfake.SeedTopics(1, DefaultProgressTopic)},
	})}
}

func topicACL(name string, op kmsg.ACLOperation) kfake.ACL {
	return securekafka.ACL(kmsg.ACLResourceTypeTopic, name, op)
}

func txnACL(name string, op kmsg.ACLOperation) kfake.ACL {
	return securekafka.ACL(kmsg.ACLResourceTypeTransactionalId, name, op)
}

// fullGrants is what an exactly-once relay needs with its topics there:
// Write on its output topic, Write and Read on the progress topic, Write
// on its transactional id (each implies Describe).
func fullGrants() map[string]kfake.ACL {
	return map[string]kfake.ACL{
		"out-write":      topicACL(aclTopic, kmsg.ACLOperationWrite),
		"progress-write": topicACL(DefaultProgressTopic, kmsg.ACLOperationWrite),
		"progress-read":  topicACL(DefaultProgressTopic, kmsg.ACLOperationRead),
		"txn-write":      txnACL(aclTxnID, kmsg.ACLOperationWrite),
	}
}

func without(m map[string]kfake.ACL, drop string) []kfake.ACL {
	var out []kfake.ACL
	for k, a := range m {
		if k != drop {
			out = append(out, a)
		}
	}
	return out
}

// logLines is a slog handler's output, safe to read while written.
type logLines = testutil.SyncBuffer

func securedConfig(t *testing.T, s *secured, password string, logs *logLines) Config {
	cfg := testConfig(t, []string{s.Addr})
	cfg.Kafka = s.Settings(t, relayUser, password)
	cfg.TransactionalID = aclTxnID
	cfg.UnauthorizedBackoff = 300 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	return cfg
}

// waitState waits for the relay's state and an error holding each of
// want.
func waitState(t *testing.T, rr *running, state State, want ...string) Status {
	t.Helper()
	var st Status
	wait(t, 20*time.Second, func() error {
		st = rr.r.Status()
		if st.State != state {
			return fmt.Errorf("state %s (error %q), want %s", st.State, st.LastError, state)
		}
		for _, w := range want {
			if !strings.Contains(st.LastError, w) {
				return fmt.Errorf("last error %q does not say %q", st.LastError, w)
			}
		}
		return nil
	})
	return st
}

// Over TLS and SCRAM, with exactly the grants it needs, the relay
// publishes every row exactly once.
func TestRelay_SecuredExactlyOnce(t *testing.T) {
	s := startSecured(t, without(fullGrants(), "")...)
	store := outboxtest.TempStore(t)
	ids := emit(t, store, "f", keyed(aclTopic, 300, 7, 0)...)
	var logs logLines
	rr := startRelay(t, store, securedConfig(t, s, relayPassword, &logs))
	rr.waitPublished(t, ids[len(ids)-1])
	rr.stop(t)
	recs := readCommitted(t, []string{s.Addr}, aclTopic, securekafka.Kgo(s.Settings(t, securekafka.AdminUser, securekafka.AdminPassword))...)
	exactlyOnce(t, recs, ids)
	checkKeyOrder(t, recs)
}

// Each missing grant stops the relay with state unauthorized and an error
// naming the principal, the operation and the resource, logged once; once
// an operator grants it, the relay publishes by itself, every row once.
func TestRelay_MissingACL(t *testing.T) {
	cases := []struct {
		drop  string
		want  string
		grant func() *kadm.ACLBuilder
	}{
		{"out-write", `User:relay lacks Write on topic "out" (TOPIC_AUTHORIZATION_FAILED)`,
			func() *kadm.ACLBuilder { return kadm.NewACLs().Topics(aclTopic).Operations(kadm.OpWrite) }},
		{"txn-write", `User:relay lacks Write on transactional id "tx-1" (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)`,
			func() *kadm.ACLBuilder { return kadm.NewACLs().TransactionalIDs(aclTxnID).Operations(kadm.OpWrite) }},
		{"progress-read", `User:relay lacks Read on topic "__outboxd_progress" (TOPIC_AUTHORIZATION_FAILED)`,
			func() *kadm.ACLBuilder {
				return kadm.NewACLs().Topics(DefaultProgressTopic).Operations(kadm.OpRead)
			}},
		{"progress-write", `User:relay lacks Write on topic "__outboxd_progress" (TOPIC_AUTHORIZATION_FAILED)`,
			func() *kadm.ACLBuilder {
				return kadm.NewACLs().Topics(DefaultProgressTopic).Operations(kadm.OpWrite)
			}},
	}
	for _, c := range cases {
		t.Run(c.drop, func(t *testing.T) {
			s := startSecured(t, without(fullGrants(), c.drop)...)
			store := outboxtest.TempStore(t)
			ids := emit(t, store, "f", keyed(aclTopic, 50, 5, 0)...)
			var logs logLines
			if c.drop == "progress-read" {
				// The progress is read only when there is some: publish a
				// first batch as the superuser.
				var adminLogs logLines
				cfg := securedConfig(t, s, relayPassword, &adminLogs)
				cfg.Kafka = s.Settings(t, securekafka.AdminUser, securekafka.AdminPassword)
				first := startRelay(t, store, cfg)
				first.waitPublished(t, ids[len(ids)-1])
				first.stop(t)
				ids = append(ids, emit(t, store, "f", keyed(aclTopic, 50, 5, 50)...)...)
			}
			rr := startRelay(t, store, securedConfig(t, s, relayPassword, &logs))
			waitState(t, rr, StateUnauthorized, c.want)
			// Several refusals later, still one log line.
			before := s.Accepts.Load()
			wait(t, 10*time.Second, func() error {
				if n := s.Accepts.Load() - before; n < 3 {
					return fmt.Errorf("%d connections since the first refusal", n)
				}
				return nil
			})
			if n := logs.Count("Kafka refused the relay"); n != 1 {
				t.Fatalf("%d log lines of the refusal, want 1:\n%s", n, logs.String())
			}
			if n := logs.Count(strings.ReplaceAll(c.want, `"`, `\"`)); n != 1 {
				t.Fatalf("the refusal %q logged %d times, want once", c.want, n)
			}
			s.Grant(t, c.grant())
			rr.waitPublished(t, ids[len(ids)-1])
			rr.stop(t)
			if n := logs.Count("Kafka allows the relay again"); n != 1 {
				t.Fatalf("%d log lines of the relay allowed again, want 1", n)
			}
			exactlyOnce(t, readCommitted(t, []string{s.Addr}, aclTopic, securekafka.Kgo(s.Settings(t, securekafka.AdminUser, securekafka.AdminPassword))...), ids)
		})
	}
	t.Run("Create", func(t *testing.T) {
		s := startSecured(t, append(without(fullGrants(), ""), topicACL("new", kmsg.ACLOperationWrite))...)
		store := outboxtest.TempStore(t)
		ids := emit(t, store, "f", keyed("new", 10, 2, 0)...)
		var logs logLines
		rr := startRelay(t, store, securedConfig(t, s, relayPassword, &logs))
		waitState(t, rr, StateUnauthorized, `User:relay lacks Create on topic "new"`)
		s.Grant(t, kadm.NewACLs().Topics("new").Operations(kadm.OpCreate))
		rr.waitPublished(t, ids[len(ids)-1])
	})
	t.Run("IdempotentWrite", func(t *testing.T) {
		// An at-least-once producer needs IdempotentWrite on the cluster,
		// or Write on some topic.
		s := startSecured(t)
		store := outboxtest.TempStore(t)
		emit(t, store, "f", keyed(aclTopic, 10, 2, 0)...)
		var logs logLines
		cfg := securedConfig(t, s, relayPassword, &logs)
		cfg.Mode = ModeAtLeastOnce
		rr := startRelay(t, store, cfg)
		waitState(t, rr, StateUnauthorized, `User:relay lacks IdempotentWrite on cluster "kafka-cluster" (CLUSTER_AUTHORIZATION_FAILED)`)
	})
}

// A wrong password is one clear error: the relay's state says
// unauthorized, the error names the mechanism and the user, it is logged
// once, and each retry costs one connection, every UnauthorizedBackoff.
func TestRelay_WrongPassword(t *testing.T) {
	s := startSecured(t, without(fullGrants(), "")...)
	store := outboxtest.TempStore(t)
	ids := emit(t, store, "f", keyed(aclTopic, 20, 2, 0)...)
	var logs logLines
	cfg := securedConfig(t, s, "not-the-password", &logs)
	rr := startRelay(t, store, cfg)
	waitState(t, rr, StateUnauthorized, "SASL", "SCRAM-SHA-512", `"relay"`, "wrong user or password")
	start, n0 := time.Now(), s.Accepts.Load()
	wait(t, 10*time.Second, func() error {
		if s.Accepts.Load()-n0 < 4 {
			return fmt.Errorf("%d connections", s.Accepts.Load()-n0)
		}
		return nil
	})
	took, n := time.Since(start), s.Accepts.Load()-n0
	if most := int64(took/cfg.UnauthorizedBackoff) + 2; n > most {
		t.Fatalf("%d connections in %v, want at most %d (one per %v)", n, took, most, cfg.UnauthorizedBackoff)
	}
	if got := logs.Count("Kafka refused the relay"); got != 1 {
		t.Fatalf("%d log lines of the refusal, want 1:\n%s", got, logs.String())
	}
	if strings.Contains(logs.String(), "not-the-password") || strings.Contains(rr.r.Status().LastError, "not-the-password") {
		t.Fatal("the password shows in the log or the status")
	}
	if st := rr.r.Status(); st.LastPublishedID != 0 {
		t.Fatalf("published through %d with a wrong password", st.LastPublishedID)
	}
	_ = ids
}
