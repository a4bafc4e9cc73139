package securekafka

import (
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxd/outboxd/internal/kafkasec"
)

// Kgo returns the franz-go client options that connect as s does: the
// tests' independent franz-go readers and administrators use them; the
// product connects with sarama only.
func Kgo(s kafkasec.Settings) []kgo.Opt {
	var opts []kgo.Opt
	if s.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(s.TLS.Clone()))
	}
	if m := mechanism(s); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts
}

// mechanism is s's SASL as a franz-go mechanism, nil for none.
func mechanism(s kafkasec.Settings) sasl.Mechanism {
	pass := string(s.SASL.Password)
	switch s.SASL.Mechanism {
	case kafkasec.MechanismPlain:
		return plain.Auth{User: s.SASL.User, Pass: pass}.AsMechanism()
	case kafkasec.MechanismSCRAMSHA256:
		return scram.Auth{User: s.SASL.User, Pass: pass}.AsSha256Mechanism()
	case kafkasec.MechanismSCRAMSHA512:
		return scram.Auth{User: s.SASL.User, Pass: pass}.AsSha512Mechanism()
	}
	return nil
}
