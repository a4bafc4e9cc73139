package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/outbox"
)

// What --on-processor-change may say of a feed whose stored processor is
// not the one it starts with.
const (
	// processorChangeRestart starts the feed over from the beginning of
	// its source: its positions are forgotten.
	processorChangeRestart = outbox.ProcessorRestart
	// processorChangeKeep keeps the feed's position and state for the new
	// processor, on purpose.
	processorChangeKeep = outbox.ProcessorKeep
)

// processorID is what names the processor of feed fc for its state: a
// SQL processor's kind is sql and its fingerprint covers what decides
// which items change the state and how (input, columns, setup, reject,
// apply), not what it emits; a built-in or registered processor's kind is
// its name.
func (c *Config) processorID(fc *FeedConfig) outbox.ProcessorID {
	if !c.declaredProcessor(fc.Processor) {
		return outbox.ProcessorID{Kind: fc.Processor}
	}
	sc := c.Processors[fc.Processor].sqlConfig(fc.Processor, fc.Topic)
	state := struct {
		Kind, Input, Delimiter, Quoting string
		Trim                            bool
		Columns, Text, Required         []string
		Fields                          map[string]string
		Setup, Reject, Apply            string
		// Set only when used, so that the fingerprints of processors
		// without them stay those they had. Migrations are not in it:
		// they evolve the state, and processor_migrations records them.
		Window *sqlproc.Window `json:",omitempty"`
		Reads  []string        `json:",omitempty"`
	}{sc.Kind, sc.Input, sc.Delimiter, sc.Quoting, sc.Trim, sc.Columns, sc.Text, sc.Required, sc.Fields,
		sc.Setup, sc.Reject, sc.Apply, nil, sc.Reads}
	if sc.Windowed() {
		state.Window = &sc.Window
	}
	b, err := json.Marshal(state) // map keys sorted: the same configuration, the same bytes
	if err != nil {
		panic(fmt.Sprintf("fingerprint of processor %s: %v", fc.Processor, err)) // strings, bools and a map of strings
	}
	sum := sha256.Sum256(b)
	return outbox.ProcessorID{Kind: "sql", Fingerprint: hex.EncodeToString(sum[:8])}
}

// processorPlan is what a start does with a feed's recorded processor
// once it owns the database.
type processorPlan struct {
	feed string
	id   outbox.ProcessorID
	how  string // an outbox.Processor* constant; "" when nothing is to record
	was  outbox.FeedProcessor
}

// checkProcessors compares each feed's processor with the one the
// database recorded for it, reading only. A feed with state that starts
// with another processor is a *ConfigError (exit code 2, the database
// untouched) unless --on-processor-change says what to do: the position
// would be kept and the state, another processor's, read as this one's.
// A database from before processors were recorded holds the processor's
// name only: the same name is adopted, another is a change.
func (m *Main) checkProcessors(ctx context.Context) ([]processorPlan, error) {
	var plans []processorPlan
	for _, name := range m.Config.FeedNames() {
		fc := m.Config.Feeds[name]
		id := m.Config.processorID(fc)
		was, err := m.Store.FeedProcessor(ctx, name)
		if err != nil {
			return nil, err
		}
		p := processorPlan{feed: name, id: id, was: was}
		switch {
		case was.Recorded && was.ID == id:
			// The same processor: nothing to say (a renamed SQL processor
			// with the same statements too).
		case !was.HasState:
			p.how = outbox.ProcessorNew
		case !was.Recorded && was.Name == fc.Processor:
			p.how = outbox.ProcessorAdopted
		case fc.OnProcessorChange != "":
			p.how = fc.OnProcessorChange
		default:
			return nil, configErr("feed %s: its state was made by processor %s, and this start gives it %s: "+
				"its position would be kept and its state read as the new processor's; give --on-processor-change %s=restart "+
				"to start the feed over from the beginning of its source, or %s=keep to keep its position and state on purpose",
				name, describeStored(was), describeProcessor(fc.Processor, id), name, name)
		}
		plans = append(plans, p)
	}
	return plans, nil
}

// describeProcessor names processor name of id for people: "ledger",
// "sql-ledger (sql, fingerprint 1f0c...)".
func describeProcessor(name string, id outbox.ProcessorID) string {
	if id.Kind == name && id.Fingerprint == "" {
		return name
	}
	if name == "" {
		return id.String()
	}
	return name + " (" + id.String() + ")"
}

// describeStored names the processor the database holds for a feed.
func describeStored(fp outbox.FeedProcessor) string {
	if !fp.Recorded {
		return fp.Name
	}
	return describeProcessor(fp.Name, fp.ID)
}

// recordProcessors carries the plans out once the database is claimed: it
// records each feed's processor and, for a restart, forgets its positions,
// so the next start with the same processor is quiet.
func (m *Main) recordProcessors(ctx context.Context, plans []processorPlan) error {
	loops := make(map[string]*ingest.Loop, len(m.Loops))
	for _, l := range m.Loops {
		loops[l.Name()] = l
	}
	for _, p := range plans {
		l := loops[p.feed]
		if p.how == "" || l == nil {
			continue
		}
		name, fc := p.feed, m.Config.Feeds[p.feed]
		info := outbox.FeedInfo{Name: name, Kind: l.Feed().Kind(), Source: l.Feed().Source(), Processor: fc.Processor}
		if err := m.Store.RecordProcessor(ctx, info, p.id, p.how); err != nil {
			return err
		}
		log := m.Logger.With("feed", name, "processor", describeProcessor(fc.Processor, p.id))
		switch p.how {
		case outbox.ProcessorAdopted:
			log.Info("this database did not record the feed's processor: the one it starts with, of the same name, is recorded now; " +
				"a later start with another processor is refused")
		case outbox.ProcessorRestart:
			log.Warn("the feed's processor changed (--on-processor-change restart): the feed starts over from the beginning of its source, "+
				"every item applied again and its outputs published again", "was", describeStored(p.was))
		case outbox.ProcessorKeep:
			log.Warn("the feed's processor changed (--on-processor-change keep): its position and state are kept for the new processor",
				"was", describeStored(p.was))
		}
	}
	return nil
}
