package orders

import (
	"context"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// maxRetryShift caps the doubling of the retry delay, so it cannot overflow.
const maxRetryShift = 20

// RetryTopic is the topic refused events go to, to come back later ("" for
// none): the processor's half of ingest's retry-topic contract.
func (p *Processor) RetryTopic() string { return p.cfg.RetryTopic }

var _ ingest.RetryTopicUser = (*Processor)(nil)

// origin returns where the delivered record was first read, and which
// attempt this is (see ingest.OriginOf). The origin of an event of the main
// topic is named by the configured source topic.
func (p *Processor) origin(d ingest.Delivery, item ingest.Item) (Place, int, error) {
	o, attempt, err := ingest.OriginOf(d, item, p.cfg.RetryTopic)
	if err != nil {
		return Place{}, 0, err
	}
	if attempt == 1 {
		o.Topic = p.cfg.SourceTopic
	}
	return Place(o), attempt, nil
}

// retryDelay is how long attempt waits after the one before it: RetryDelay
// before attempt 2, doubling for each attempt after.
func (p *Processor) retryDelay(attempt int) time.Duration {
	return p.cfg.RetryDelay << min(attempt-2, maxRetryShift)
}

// retry sends the record to the retry topic, to come back as attempt
// after its delay, with its original place.
func (p *Processor) retry(ctx context.Context, tx *outbox.Tx, item ingest.Item, from Place, attempt int) error {
	due := p.cfg.Now().Add(p.retryDelay(attempt))
	return tx.Emit(ctx, ingest.RetryOutput(p.cfg.RetryTopic, item, ingest.Origin(from), attempt, due))
}
