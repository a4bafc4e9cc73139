package relay

import (
	"time"

	"github.com/IBM/sarama"
)

// producerMessages is recs as sarama's own producer takes them, for a test
// that produces the relay's records with it.
func producerMessages(recs []*record) []*sarama.ProducerMessage {
	ms := make([]*sarama.ProducerMessage, len(recs))
	for i, r := range recs {
		m := &sarama.ProducerMessage{Topic: r.topic, Timestamp: time.UnixMilli(r.at)}
		if r.rec.Key != nil {
			m.Key = sarama.ByteEncoder(r.rec.Key)
		}
		if r.rec.Value != nil {
			m.Value = sarama.ByteEncoder(r.rec.Value)
		}
		for _, h := range r.rec.Headers {
			m.Headers = append(m.Headers, *h)
		}
		ms[i] = m
	}
	return ms
}
