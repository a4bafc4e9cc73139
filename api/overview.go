package api

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// Health levels of a Verdict and of each Condition.
const (
	LevelOK       = "ok"
	LevelWarning  = "warning"
	LevelCritical = "critical"
)

// Conditions a Verdict reports, worst first: the order in which they are
// listed, and in which the dashboard's banner and `outboxd status` pick
// the one to say first.
const (
	CondDatabase          = "database"                        // the database takes no writes
	CondNotLossless       = "not-lossless"                    // a feed moved past input it did not keep
	CondFailed            = string(outbox.StateFailed)        // a feed stopped until a restart
	CondRelayFenced       = "relay-" + RelayStateFenced       // another producer took the relay's transactional id
	CondRelayUnauthorized = "relay-" + RelayStateUnauthorized // Kafka refuses the relay
	CondRelayRefusing     = "relay-" + RelayStateRefusing     // the relay refuses a database gone back in time
	CondStalled           = string(outbox.StateStalled)       // a feed cannot move
	CondBackpressure      = string(outbox.StateBackpressure)  // the outbox is past its bound: ingest waits for the relay
	CondRelayDown         = "relay-down"                      // the relay is not connected
	CondDeadLetters       = "dead-letters"                    // dead letters nobody resolved, stored in the last hour
)

// DeadLetterWindow is how far back the verdict looks for dead letters no
// one resolved; deadLetterCountCap caps each feed's count (the count reads
// an index, up to the cap).
const (
	DeadLetterWindow   = time.Hour
	deadLetterCountCap = 10000
)

// Overview is the body of GET /status: what the dashboard shows, read at
// once: the verdict, readiness, every feed's status, the outbox and the
// relay, and the dead letters of the last hour no one resolved.
type Overview struct {
	At      time.Time    `json:"at"`
	Verdict Verdict      `json:"verdict"`
	Ready   Readiness    `json:"readiness"`
	Feeds   []FeedStatus `json:"feeds"`
	Outbox  OutboxStatus `json:"outbox"`
	// RecentDeadLetters counts, per feed with any, the dead letters stored
	// in the last DeadLetterWindow that no one requeued or discarded.
	RecentDeadLetters []RecentDeadLetters `json:"recentDeadLetters"`
}

// RecentDeadLetters is one feed's count of recent open dead letters;
// AtLeast is true when the count stopped at its cap (10000).
type RecentDeadLetters struct {
	Feed    string `json:"feed"`
	Count   int64  `json:"count"`
	AtLeast bool   `json:"atLeast"`
}

// Verdict says the worst thing true right now, and every other one.
// Level is the worst condition's (ok when there is none); Message and
// Action are the worst condition's, or say all is well.
type Verdict struct {
	Level      string      `json:"level"`
	Message    string      `json:"message"`
	Action     string      `json:"action"`
	Conditions []Condition `json:"conditions"`
}

// Condition is one thing an operator should look at: its code (Cond*), its
// level, what it is about (a feed's name, "relay", "database"), what is
// true and what to do.
type Condition struct {
	Code    string `json:"code"`
	Level   string `json:"level"`
	Subject string `json:"subject"`
	Message string `json:"message"`
	Action  string `json:"action"`
}

// overview reads everything of GET /status.
func (s *Server) overview(ctx context.Context) (Overview, error) {
	ov := Overview{At: s.store.Now().UTC()}
	var err error
	if ov.Feeds, err = s.feedStatuses(ctx); err != nil {
		return ov, err
	}
	if ov.Outbox, err = s.outboxStatus(ctx); err != nil {
		return ov, err
	}
	counts, err := s.store.OpenDeadLetters(ctx, s.store.Now().Add(-DeadLetterWindow), deadLetterCountCap)
	if err != nil {
		return ov, err
	}
	ov.RecentDeadLetters = make([]RecentDeadLetters, 0, len(counts))
	for _, c := range counts {
		ov.RecentDeadLetters = append(ov.RecentDeadLetters, RecentDeadLetters{Feed: c.Feed, Count: c.N, AtLeast: c.AtLeast})
	}
	ov.Ready = s.readiness(ctx)
	ov.Verdict = verdict(ov)
	return ov, nil
}

// handleOverview serves GET /status.
func (s *Server) handleOverview(w http.ResponseWriter, r *http.Request) {
	ov, err := s.overview(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ov)
}

// verdict finds the conditions true in ov, worst first.
func verdict(ov Overview) Verdict {
	var cs []Condition
	add := func(code, level, subject, msg, action string) {
		cs = append(cs, Condition{Code: code, Level: level, Subject: subject, Message: msg, Action: action})
	}
	for _, c := range ov.Ready.Checks {
		if c.Name == "database" && !c.OK {
			add(CondDatabase, LevelCritical, "database", "the database takes no writes: "+c.Message,
				"free disk space or fix the file's permissions; the feeds stall and resume by themselves once it is writable")
		}
	}
	byState := func(code, level string, st outbox.FeedState, msg, action func(FeedStatus) string) {
		for _, fs := range ov.Feeds {
			if fs.State == st {
				add(code, level, fs.Feed, msg(fs), action(fs))
			}
		}
	}
	for _, fs := range ov.Feeds {
		if !fs.Lossless {
			add(CondNotLossless, LevelCritical, fs.Feed, lossMessage(fs),
				fmt.Sprintf("find the lost input (from its source or a backup) and apply it, then acknowledge: outboxd losses ack %s --reason '...'", fs.Feed))
		}
	}
	byState(CondFailed, LevelCritical, outbox.StateFailed,
		func(fs FeedStatus) string { return fmt.Sprintf("feed %s FAILED: %s", fs.Feed, fs.LastError) },
		func(FeedStatus) string { return "fix the cause, then restart outboxd: nothing is applied until then" })
	rs := ov.Outbox.Relay
	switch {
	case rs.Fenced || rs.State == RelayStateFenced:
		add(CondRelayFenced, LevelCritical, "relay", "the relay is fenced: another producer took over its transactional id",
			"make sure one outboxd runs on this database, then restart it")
	case rs.State == RelayStateRefusing:
		add(CondRelayRefusing, LevelCritical, "relay", "the relay publishes nothing: "+rs.LastError,
			"the database is older than what the relay published: see Published once in docs/guarantees.md (restore the newer file, or start afresh with --new-database)")
	case rs.State == RelayStateUnauthorized:
		add(CondRelayUnauthorized, LevelCritical, "relay", "Kafka refuses the relay: "+rs.LastError,
			"grant the ACLs the error names (or fix the credentials); the relay asks again every 10 s, nothing is lost meanwhile")
	}
	byState(CondStalled, LevelCritical, outbox.StateStalled,
		func(fs FeedStatus) string { return fmt.Sprintf("feed %s is STALLED: %s", fs.Feed, fs.LastError) },
		func(FeedStatus) string {
			return "fix the cause the error names; the feed retries by itself and resumes, nothing is lost"
		})
	byState(CondBackpressure, LevelWarning, outbox.StateBackpressure,
		func(fs FeedStatus) string {
			return fmt.Sprintf("feed %s waits for the relay: %s", fs.Feed, fs.LastError)
		},
		func(FeedStatus) string {
			return "the outbox is past its bound (--max-backlog-bytes): see why the relay does not publish (Kafka away?); ingest resumes as it drains"
		})
	if rs.Mode != RelayModeNone && !rs.Connected && !rs.Fenced && rs.State != RelayStateUnauthorized &&
		rs.State != RelayStateRefusing && rs.State != RelayStateFenced {
		msg := fmt.Sprintf("the relay is not connected (%s)", rs.State)
		if rs.LastError != "" {
			msg += ": " + rs.LastError
		}
		add(CondRelayDown, LevelWarning, "relay", msg, "check that Kafka is reachable (--brokers); outputs wait in the outbox, nothing is lost")
	}
	for _, d := range ov.RecentDeadLetters {
		n := fmt.Sprint(d.Count)
		if d.AtLeast {
			n = "at least " + n
		}
		letters := "dead letters"
		if d.Count == 1 {
			letters = "dead letter"
		}
		add(CondDeadLetters, LevelWarning, d.Feed, fmt.Sprintf("%s %s of feed %s in the last hour, not resolved", n, letters, d.Feed),
			fmt.Sprintf("look at them (outboxd dead-letters list %s), then requeue (edited if need be) or discard each", d.Feed))
	}
	v := Verdict{Level: LevelOK, Message: "healthy: every feed lossless and moving, the relay publishing",
		Action: "nothing to do", Conditions: cs}
	if v.Conditions == nil {
		v.Conditions = []Condition{}
	}
	if len(cs) > 0 { // added worst first
		v.Level, v.Message, v.Action = cs[0].Level, cs[0].Message, cs[0].Action
	}
	return v
}

// lossMessage says what a feed lost: how many losses and the latest.
func lossMessage(fs FeedStatus) string {
	open := 0
	var last *LossStatus
	for i := range fs.Losses {
		if fs.Losses[i].AckedAt == nil {
			open++
			last = &fs.Losses[i]
		}
	}
	msg := fmt.Sprintf("feed %s is NOT LOSSLESS: %d losses not acknowledged", fs.Feed, open)
	if last != nil {
		extent := fmt.Sprintf("from %d, extent unknown", last.From)
		if last.To != nil {
			extent = fmt.Sprintf("%d to %d", last.From, *last.To)
		}
		msg += fmt.Sprintf(", the latest %s (partition %d, %s)", last.Reason, last.Partition, extent)
	}
	return msg
}
