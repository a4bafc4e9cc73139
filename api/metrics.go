package api

import (
	"context"
	"maps"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/outboxd/outboxd/outbox"
)

// Metric names. Counters and gauges are read from the store at scrape
// time by the same code that serves the status JSON, so they equal it;
// histograms are fed by the ingest loops and the relay through Metrics.
const (
	MetricFeedApplied            = "outboxd_feed_applied_total"
	MetricFeedReplaysSkipped     = "outboxd_feed_replays_skipped_total"
	MetricFeedRetries            = "outboxd_feed_retries_total"
	MetricFeedCompletionFailures = "outboxd_feed_completion_failures_total"
	MetricFeedEpochChanges       = "outboxd_feed_epoch_changes_total"
	MetricFeedLosses             = "outboxd_feed_losses_total"
	MetricFeedLossless           = "outboxd_feed_lossless"
	MetricFeedDeadLetters        = "outboxd_feed_dead_letters_total"
	// A partition's position, end and lag are named by their unit:
	// bytes for a file feed, records for a Kafka feed.
	MetricFeedPositionBytes   = "outboxd_feed_position_bytes"
	MetricFeedEndBytes        = "outboxd_feed_end_bytes"
	MetricFeedLagBytes        = "outboxd_feed_lag_bytes"
	MetricFeedPositionRecords = "outboxd_feed_position_records"
	MetricFeedEndRecords      = "outboxd_feed_end_records"
	MetricFeedLagRecords      = "outboxd_feed_lag_records"
	MetricFeedState           = "outboxd_feed_state"
	MetricFeedLastApplied     = "outboxd_feed_last_applied_timestamp_seconds"
	MetricFeedOutboxPending   = "outboxd_feed_outbox_pending"
	MetricFeedOutboxOldestAge = "outboxd_feed_outbox_oldest_pending_age_seconds"

	MetricOutboxPending         = "outboxd_outbox_pending"
	MetricOutboxOldestAge       = "outboxd_outbox_oldest_pending_age_seconds"
	MetricOutboxLastPublishedID = "outboxd_outbox_last_published_id"
	MetricOutboxLastID          = "outboxd_outbox_last_id"
	MetricOutboxPendingBytes    = "outboxd_outbox_pending_bytes"
	MetricOutboxMaxBacklogBytes = "outboxd_outbox_max_backlog_bytes"
	MetricOutboxMaxBacklogRows  = "outboxd_outbox_max_backlog_rows"

	MetricRelayPublished  = "outboxd_relay_published_total"
	MetricRelayConnected  = "outboxd_relay_connected"
	MetricRelayFenced     = "outboxd_relay_fenced"
	MetricRelayState      = "outboxd_relay_state"
	MetricRelayTxnSeconds = "outboxd_relay_transaction_duration_seconds"
	MetricRelayTxnRecords = "outboxd_relay_transaction_records"
	MetricRelayErrors     = "outboxd_relay_errors_total"

	MetricIngestBatchItems    = "outboxd_ingest_batch_items"
	MetricIngestCommitSeconds = "outboxd_ingest_commit_duration_seconds"

	MetricSQLiteWALBytes          = "outboxd_sqlite_wal_bytes"
	MetricSQLiteCheckpointSeconds = "outboxd_sqlite_checkpoint_duration_seconds"
	MetricSQLiteCheckpointsBusy   = "outboxd_sqlite_checkpoints_busy_total"

	MetricAPIDeadLetterRequests = "outboxd_api_dead_letter_requests"

	MetricBuildInfo = "outboxd_build_info"
)

// Metrics takes the measurements the store does not keep: batch sizes and
// commit latencies of the ingest loops, durations and sizes of the relay's
// transactions, durations of WAL checkpoints. Its methods are safe for
// concurrent use, cheap, and do nothing on a nil *Metrics.
type Metrics struct {
	batchSize      *prometheus.HistogramVec
	commit         *prometheus.HistogramVec
	relayTxn       prometheus.Histogram
	relayBatch     prometheus.Histogram
	checkpoint     prometheus.Histogram
	checkpointBusy prometheus.Counter
}

// SizeBuckets are the buckets of a histogram of sizes up to max: the
// powers of two below it, then max itself, so that a full batch is
// counted as one, not as "more than the largest bucket".
func SizeBuckets(max int) []float64 {
	var b []float64
	for v := 1; v < max; v *= 2 {
		b = append(b, float64(v))
	}
	return append(b, float64(max))
}

func newMetrics(cfg Config) *Metrics {
	return &Metrics{
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: MetricIngestBatchItems, Help: "Items per ingest batch (one transaction); the last bucket is the configured --batch-max.",
			Buckets: SizeBuckets(cfg.BatchMax),
		}, []string{"feed"}),
		commit: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: MetricIngestCommitSeconds, Help: "Time to commit an ingest batch's transaction.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"feed"}),
		relayTxn: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: MetricRelayTxnSeconds, Help: "Time to publish and commit one relay transaction (or acked batch).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		relayBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: MetricRelayTxnRecords, Help: "Outbox rows per relay transaction (or acked batch); the last bucket is the configured --relay-batch.",
			Buckets: SizeBuckets(cfg.RelayBatchMax),
		}),
		checkpoint: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: MetricSQLiteCheckpointSeconds, Help: "Time of a periodic passive checkpoint of the SQLite write-ahead log.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		checkpointBusy: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricSQLiteCheckpointsBusy, Help: "Checkpoints that could not copy the whole write-ahead log (a reader held it).",
		}),
	}
}

// ObserveCheckpoint records one checkpoint of the write-ahead log.
func (m *Metrics) ObserveCheckpoint(r outbox.CheckpointResult) {
	if m == nil {
		return
	}
	m.checkpoint.Observe(r.Duration.Seconds())
	if r.Busy {
		m.checkpointBusy.Inc()
	}
}

// ObserveBatch records one committed ingest batch of feed: its number of
// items and how long its COMMIT took.
func (m *Metrics) ObserveBatch(feed string, size int, commit time.Duration) {
	if m == nil {
		return
	}
	m.batchSize.WithLabelValues(feed).Observe(float64(size))
	m.commit.WithLabelValues(feed).Observe(commit.Seconds())
}

// ObserveRelayTxn records one relay transaction (exactly-once) or acked
// batch (at-least-once): how long it took and how many rows it carried.
func (m *Metrics) ObserveRelayTxn(d time.Duration, records int) {
	if m == nil {
		return
	}
	m.relayTxn.Observe(d.Seconds())
	m.relayBatch.Observe(float64(records))
}

// newRegistry registers the Go and process collectors, the histograms and
// the collector reading the store.
func (s *Server) newRegistry() (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	for name := range s.feeds {
		// Show the feed's histograms (empty) before its first batch.
		s.metrics.batchSize.WithLabelValues(name)
		s.metrics.commit.WithLabelValues(name)
	}
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		s.metrics.batchSize, s.metrics.commit, s.metrics.relayTxn, s.metrics.relayBatch,
		s.metrics.checkpoint, s.metrics.checkpointBusy,
		newStatusCollector(s),
		newRecordingCollector(s),
		buildInfo(),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricAPIDeadLetterRequests,
			Help: "Dead-letter requests being served (at most 4 at once; others wait their turn).",
		}, func() float64 { return float64(DeadLetterConcurrency - len(s.deadLetterTurns)) }),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return reg, nil
}

// scrapeTimeout bounds the store reads of one scrape.
const scrapeTimeout = 5 * time.Second

// statusCollector reads the feeds' and the outbox's status at scrape time.
type statusCollector struct {
	s     *Server
	feed  map[string]*prometheus.Desc // labels feed
	part  map[string]*prometheus.Desc // labels feed, partition
	glob  map[string]*prometheus.Desc // no labels
	state *prometheus.Desc            // feed, state
	relay *prometheus.Desc            // mode, state
	dead  *prometheus.Desc            // feed, reason
	errs  *prometheus.Desc            // class
	error *prometheus.Desc
}

var (
	feedCounters = map[string]string{
		MetricFeedApplied:            "Items whose effects are in the state (not dead letters, not replays).",
		MetricFeedReplaysSkipped:     "Items delivered again and skipped as already applied.",
		MetricFeedRetries:            "Retries of items that failed transiently.",
		MetricFeedCompletionFailures: "Batches whose commit kept failing and that were skipped.",
		MetricFeedEpochChanges:       "Changes of the source's epoch (file replaced or truncated, topic re-created).",
		MetricFeedLosses:             "Losses recorded (acknowledged ones included).",
	}
	feedGauges = map[string]string{
		MetricFeedLossless:        "1 while the feed is lossless, 0 once it moved past input whose effects were not kept.",
		MetricFeedLastApplied:     "Time of the last applied item, unix seconds (0: never).",
		MetricFeedOutboxPending:   "Outbox rows of the feed waiting to be published.",
		MetricFeedOutboxOldestAge: "Age of the feed's oldest unpublished outbox row, seconds.",
	}
	partitionGauges = map[string]string{
		MetricFeedPositionBytes:   "Stored position of a file feed's partition: the byte offset after the last line applied.",
		MetricFeedEndBytes:        "Size of a file feed's file as last seen, bytes.",
		MetricFeedLagBytes:        "Bytes of a file feed's file not yet applied (end minus position).",
		MetricFeedPositionRecords: "Stored position of a Kafka feed's partition: the offset after the last record applied.",
		MetricFeedEndRecords:      "High watermark of a Kafka feed's partition as last seen.",
		MetricFeedLagRecords:      "Records of a Kafka feed's partition not yet applied (end minus position).",
	}
	// partitionNames are the partition gauges of a feed kind: position,
	// end and lag.
	partitionNames = map[string][3]string{
		UnitBytes:   {MetricFeedPositionBytes, MetricFeedEndBytes, MetricFeedLagBytes},
		UnitRecords: {MetricFeedPositionRecords, MetricFeedEndRecords, MetricFeedLagRecords},
	}
	globalMetrics = map[string]string{
		MetricOutboxPending:         "Outbox rows waiting to be published.",
		MetricOutboxOldestAge:       "Age of the oldest unpublished outbox row, seconds.",
		MetricOutboxLastPublishedID: "Last outbox id known published.",
		MetricOutboxLastID:          "Last outbox id assigned.",
		MetricOutboxPendingBytes:    "Bytes of the outbox rows waiting to be published (about what they take on disk).",
		MetricOutboxMaxBacklogBytes: "Bound on the pending bytes: past it ingest pauses (feed state backpressure); 0: none.",
		MetricOutboxMaxBacklogRows:  "Bound on the pending rows: past it ingest pauses (feed state backpressure); 0: none.",
		MetricRelayPublished:        "Rows the relay published since it started.",
		MetricRelayConnected:        "1 while the relay's producer is connected.",
		MetricRelayFenced:           "1 once another producer took over the relay's transactional id.",
		MetricSQLiteWALBytes:        "Size of the SQLite write-ahead log file, bytes.",
	}
)

func newStatusCollector(s *Server) *statusCollector {
	c := &statusCollector{s: s, feed: map[string]*prometheus.Desc{}, part: map[string]*prometheus.Desc{}, glob: map[string]*prometheus.Desc{}}
	for name, help := range feedCounters {
		c.feed[name] = prometheus.NewDesc(name, help, []string{"feed"}, nil)
	}
	for name, help := range feedGauges {
		c.feed[name] = prometheus.NewDesc(name, help, []string{"feed"}, nil)
	}
	for name, help := range partitionGauges {
		c.part[name] = prometheus.NewDesc(name, help, []string{"feed", "partition"}, nil)
	}
	for name, help := range globalMetrics {
		c.glob[name] = prometheus.NewDesc(name, help, nil, nil)
	}
	c.state = prometheus.NewDesc(MetricFeedState,
		"1 for the feed's current state (running, caught-up, waiting, backpressure, stalled, failed, stopped), 0 for the others.", []string{"feed", "state"}, nil)
	c.relay = prometheus.NewDesc(MetricRelayState,
		"1 for the relay's current state, 0 for the others (starting, publishing, idle, backing-off, unauthorized, refusing, fenced, stopped, off); mode none: the relay is off.",
		[]string{"mode", "state"}, nil)
	c.dead = prometheus.NewDesc(MetricFeedDeadLetters,
		"Dead letters stored, by reason (malformed, line-too-long, retries-exhausted, constraint, output-too-large, ...); requeued and discarded ones included.",
		[]string{"feed", "reason"}, nil)
	c.errs = prometheus.NewDesc(MetricRelayErrors,
		"Relay failures by class: retryable (backs off), ambiguous (starts over from Kafka's progress), fenced, fatal (needs an operator).",
		[]string{"class"}, nil)
	c.error = prometheus.NewDesc("outboxd_api_scrape_error", "Reading the status for a scrape failed.", nil, nil)
	return c
}

// Describe sends every descriptor.
func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range []map[string]*prometheus.Desc{c.feed, c.part, c.glob} {
		for _, d := range m {
			ch <- d
		}
	}
	for _, d := range []*prometheus.Desc{c.state, c.relay, c.dead, c.errs, c.error} {
		ch <- d
	}
}

// Collect reads the status; a failed read makes the scrape fail.
func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	if err := c.collect(ctx, ch); err != nil {
		c.s.log.Error("metrics scrape", logKeyErr, err)
		ch <- prometheus.NewInvalidMetric(c.error, err)
	}
}

func (c *statusCollector) collect(ctx context.Context, ch chan<- prometheus.Metric) error {
	os, err := c.s.outboxStatus(ctx)
	if err != nil {
		return err
	}
	c.collectOutbox(ch, os)
	statuses, err := c.s.feedStatuses(ctx)
	if err != nil {
		return err
	}
	for _, fs := range statuses {
		c.collectFeed(ch, fs)
	}
	reasons, err := c.s.store.DeadLetterReasons(ctx)
	if err != nil {
		return err
	}
	for _, r := range reasons {
		ch <- prometheus.MustNewConstMetric(c.dead, prometheus.CounterValue, float64(r.N), r.Feed, r.Reason)
	}
	wal, err := c.s.store.WALBytes()
	if err != nil {
		return err
	}
	ch <- prometheus.MustNewConstMetric(c.glob[MetricSQLiteWALBytes], prometheus.GaugeValue, float64(wal))
	return nil
}

func (c *statusCollector) collectOutbox(ch chan<- prometheus.Metric, os OutboxStatus) {
	g := func(name string, v float64) {
		ch <- prometheus.MustNewConstMetric(c.glob[name], prometheus.GaugeValue, v)
	}
	g(MetricOutboxPending, float64(os.Pending))
	g(MetricOutboxOldestAge, os.OldestPendingAge)
	g(MetricOutboxLastPublishedID, float64(os.LastPublishedID))
	g(MetricOutboxLastID, float64(os.LastOutboxID))
	g(MetricOutboxPendingBytes, float64(os.PendingBytes))
	g(MetricOutboxMaxBacklogBytes, float64(os.MaxBacklogBytes))
	g(MetricOutboxMaxBacklogRows, float64(os.MaxBacklogRows))
	ch <- prometheus.MustNewConstMetric(c.glob[MetricRelayPublished], prometheus.CounterValue, float64(os.Published))
	g(MetricRelayConnected, bool01(os.Relay.Connected))
	g(MetricRelayFenced, bool01(os.Relay.Fenced))
	states := RelayStates
	if !slices.Contains(states, os.Relay.State) {
		states = append(slices.Clone(states), os.Relay.State) // a state this list does not know yet: shown all the same
	}
	for _, st := range states {
		ch <- prometheus.MustNewConstMetric(c.relay, prometheus.GaugeValue, bool01(st == os.Relay.State), os.Relay.Mode, st)
	}
	if c.s.relay == nil {
		return
	}
	errs := c.s.relay.Status().Errors
	for _, class := range slices.Sorted(maps.Keys(errs)) {
		ch <- prometheus.MustNewConstMetric(c.errs, prometheus.CounterValue, float64(errs[class]), class)
	}
}

func (c *statusCollector) collectFeed(ch chan<- prometheus.Metric, fs FeedStatus) {
	counter := func(name string, v int64) {
		ch <- prometheus.MustNewConstMetric(c.feed[name], prometheus.CounterValue, float64(v), fs.Feed)
	}
	gauge := func(name string, v float64) {
		ch <- prometheus.MustNewConstMetric(c.feed[name], prometheus.GaugeValue, v, fs.Feed)
	}
	counter(MetricFeedApplied, fs.Applied)
	counter(MetricFeedReplaysSkipped, fs.ReplaysSkipped)
	counter(MetricFeedRetries, fs.Retries)
	counter(MetricFeedCompletionFailures, fs.CompletionFailures)
	counter(MetricFeedEpochChanges, fs.EpochChanges)
	counter(MetricFeedLosses, fs.LossCount)
	gauge(MetricFeedLossless, bool01(fs.Lossless))
	names := partitionNames[unitOf(fs.Kind)]
	for _, p := range fs.Partitions {
		part := strconv.Itoa(int(p.Partition))
		for i, v := range [3]int64{p.Position, p.End, p.Lag} {
			ch <- prometheus.MustNewConstMetric(c.part[names[i]], prometheus.GaugeValue, float64(v), fs.Feed, part)
		}
	}
	var last float64
	if fs.LastAppliedAt != nil {
		last = float64(fs.LastAppliedAt.UnixNano()) / 1e9
	}
	gauge(MetricFeedLastApplied, last)
	gauge(MetricFeedOutboxPending, float64(fs.Outbox.Pending))
	gauge(MetricFeedOutboxOldestAge, fs.Outbox.OldestPendingAge)
	for _, st := range outbox.FeedStates {
		ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, bool01(st == fs.State), fs.Feed, string(st))
	}
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// buildInfo is outboxd_build_info: 1, labelled with the binary's module
// version ("(devel)" for a build from a checkout), VCS revision ("" when
// unknown, "+dirty" appended for uncommitted changes) and Go version.
func buildInfo() prometheus.Collector {
	version, revision, goVersion := "unknown", "", runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		version, goVersion = bi.Main.Version, bi.GoVersion
		for _, st := range bi.Settings {
			switch {
			case st.Key == "vcs.revision":
				revision = st.Value + revision
			case st.Key == "vcs.modified" && st.Value == "true":
				revision += "+dirty"
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        MetricBuildInfo,
		Help:        "1, labelled with the build of outboxd: its version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": goVersion},
	})
	g.Set(1)
	return g
}
