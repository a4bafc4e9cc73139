package server

import (
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxd/outboxd/internal/kafkasec"
)

// kgoOpts returns the franz-go client options that connect as s does,
// for the consume and produce tools and the topics API.
func kgoOpts(s kafkasec.Settings) []kgo.Opt {
	var opts []kgo.Opt
	if s.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(s.TLS.Clone()))
	}
	var m sasl.Mechanism
	pass := string(s.SASL.Password)
	switch s.SASL.Mechanism {
	case kafkasec.MechanismPlain:
		m = plain.Auth{User: s.SASL.User, Pass: pass}.AsMechanism()
	case kafkasec.MechanismSCRAMSHA256:
		m = scram.Auth{User: s.SASL.User, Pass: pass}.AsSha256Mechanism()
	case kafkasec.MechanismSCRAMSHA512:
		m = scram.Auth{User: s.SASL.User, Pass: pass}.AsSha512Mechanism()
	}
	if m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts
}
