package kafkasec

import (
	"github.com/IBM/sarama"
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

var _ sarama.SCRAMClient = (*scramClient)(nil)
