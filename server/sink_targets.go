package server

// The sink targets the service offers: each package registers its URL
// schemes with sink.Register in its init function, so importing it here
// is all that offers it (docs/sinks.md).
import (
	_ "github.com/outboxd/outboxd/sink/nats"    // nats://
	_ "github.com/outboxd/outboxd/sink/pgtable" // postgres://, postgresql://
	_ "github.com/outboxd/outboxd/sink/webhook" // https://, http://
)
