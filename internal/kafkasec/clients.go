package kafkasec

import (
	"context"
	"errors"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Sarama sets sc's TLS and SASL from s. It changes nothing else.
func (s Settings) Sarama(sc *sarama.Config) {
	if s.TLS != nil {
		sc.Net.TLS.Enable = true
		sc.Net.TLS.Config = s.TLS.Clone()
	}
	if s.SASL.Mechanism == "" {
		return
	}
	sc.Net.SASL.Enable = true
	sc.Net.SASL.Handshake = true
	sc.Net.SASL.Version = sarama.SASLHandshakeV1
	sc.Net.SASL.User = s.SASL.User
	sc.Net.SASL.Password = string(s.SASL.Password)
	switch s.SASL.Mechanism {
	case MechanismPlain:
		sc.Net.SASL.Mechanism = sarama.SASLTypePlaintext
	case MechanismSCRAMSHA256:
		sc.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA256
		sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{sha512: false} }
	case MechanismSCRAMSHA512:
		sc.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
		sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{sha512: true} }
	}
}

// Kgo returns the franz-go client options of s: none for plaintext
// without SASL.
func (s Settings) Kgo() []kgo.Opt {
	var opts []kgo.Opt
	if s.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(s.TLS.Clone()))
	}
	if m := s.mechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts
}

// mechanism is s's SASL as a franz-go mechanism, nil for none.
func (s Settings) mechanism() sasl.Mechanism {
	pass := string(s.SASL.Password)
	switch s.SASL.Mechanism {
	case MechanismPlain:
		return plain.Auth{User: s.SASL.User, Pass: pass}.AsMechanism()
	case MechanismSCRAMSHA256:
		return scram.Auth{User: s.SASL.User, Pass: pass}.AsSha256Mechanism()
	case MechanismSCRAMSHA512:
		return scram.Auth{User: s.SASL.User, Pass: pass}.AsSha512Mechanism()
	}
	return nil
}

// scramClient is sarama's SCRAM conversation, carried out by franz-go's
// SCRAM implementation (RFC 5802), so that both clients authenticate with
// the same code and no other SCRAM library is needed.
type scramClient struct {
	sha512 bool
	auth   scram.Auth
	sess   sasl.Session
	done   bool
}

var _ sarama.SCRAMClient = (*scramClient)(nil)

// Begin starts a conversation as user.
func (c *scramClient) Begin(user, password, authzID string) error {
	c.auth = scram.Auth{User: user, Pass: password, Zid: authzID}
	c.sess, c.done = nil, false
	return nil
}

// Step answers the server's challenge: sarama calls it first with "" for
// the client's first message, then with each of the server's messages.
func (c *scramClient) Step(challenge string) (string, error) {
	if c.sess == nil {
		m := c.auth.AsSha256Mechanism()
		if c.sha512 {
			m = c.auth.AsSha512Mechanism()
		}
		sess, first, err := m.Authenticate(context.Background(), "")
		if err != nil {
			return "", err
		}
		c.sess = sess
		return string(first), nil
	}
	if c.done {
		return "", errors.New("scram: the conversation is over")
	}
	done, resp, err := c.sess.Challenge([]byte(challenge))
	if err != nil {
		return "", err
	}
	c.done = done
	return string(resp), nil
}

// Done reports whether the server's final message was verified.
func (c *scramClient) Done() bool { return c.done }
