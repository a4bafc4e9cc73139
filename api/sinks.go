package api

import (
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/sink"
)

// SinkStatus is a sink's status (the runner's own).
type SinkStatus = sink.Status

// SinkList is the body of GET /sinks.
type SinkList struct {
	Sinks []SinkStatus `json:"sinks"`
}

// SinkSummary is a sink as GET /outbox/status shows it.
type SinkSummary struct {
	Name      string `json:"name"`
	State     string `json:"state"`
	LagRows   int64  `json:"lagRows"`
	LagBytes  int64  `json:"lagBytes"`
	LastError string `json:"lastError"`
}

// sinkSource gives the sinks' statuses; it must be safe for concurrent
// use and not block.
type sinkSource func() []SinkStatus

// SetSinks gives the API the configured sinks' statuses, by name: served
// at GET /sinks, summed up in /outbox/status (and the dashboard), and as
// per-sink series at /metrics. Call it before the server serves.
func (s *Server) SetSinks(statuses func() []SinkStatus) {
	if statuses == nil {
		return
	}
	src := sinkSource(statuses)
	if s.sinks.Swap(&src) == nil {
		s.registry.MustRegister(sinkCollector{s})
	}
}

// sinkStatuses are the sinks' statuses ([] when none is configured).
func (s *Server) sinkStatuses() []SinkStatus {
	if p := s.sinks.Load(); p != nil {
		if st := (*p)(); st != nil {
			return st
		}
	}
	return []SinkStatus{}
}

// sinkSummaries are the sinks as /outbox/status shows them.
func (s *Server) sinkSummaries() []SinkSummary {
	st := s.sinkStatuses()
	out := make([]SinkSummary, len(st))
	for i, x := range st {
		out[i] = SinkSummary{Name: x.Name, State: x.State, LagRows: x.LagRows, LagBytes: x.LagBytes, LastError: x.LastError}
	}
	return out
}

// handleSinks serves GET /sinks.
func (s *Server) handleSinks(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, SinkList{Sinks: s.sinkStatuses()})
}

// sinkStates are the states a sink's state series has a value for.
var sinkStates = []string{sink.StateStarting, sink.StateIdle, sink.StateDelivering, sink.StateBackingOff,
	sink.StateRefusing, sink.StateStopped}

var (
	sinkDeliveredDesc = prometheus.NewDesc("outboxd_sink_delivered_total",
		"Outbox rows the sink delivered to its target since the start.", []string{"sink"}, nil)
	sinkDeadDesc = prometheus.NewDesc("outboxd_sink_dead_lettered_total",
		"Outbox rows the sink's target refused for good, stored as dead letters, since the start.", []string{"sink"}, nil)
	sinkErrorsDesc = prometheus.NewDesc("outboxd_sink_errors_total",
		"Failed attempts of the sink (the target unreachable or refusing) since the start.", []string{"sink"}, nil)
	sinkMissedDesc = prometheus.NewDesc("outboxd_sink_missed_total",
		"Outbox rows pruned before the sink read them (a sink added after they went).", []string{"sink"}, nil)
	sinkLagRowsDesc = prometheus.NewDesc("outboxd_sink_lag_rows",
		"Outbox rows after the last one the sink delivered.", []string{"sink"}, nil)
	sinkLagBytesDesc = prometheus.NewDesc("outboxd_sink_lag_bytes",
		"About the bytes the rows after the sink's last delivered one take in the database.", []string{"sink"}, nil)
	sinkDeliveredIDDesc = prometheus.NewDesc("outboxd_sink_delivered_id",
		"The last outbox id the sink delivered (or passed over, none of its topics).", []string{"sink"}, nil)
	sinkStateDesc = prometheus.NewDesc("outboxd_sink_state",
		"1 for the sink's current state, 0 for the others.", []string{"sink", "state"}, nil)
)

// sinkCollector reads the sinks' statuses at each scrape.
type sinkCollector struct{ s *Server }

func (c sinkCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sinkDeliveredDesc, sinkDeadDesc, sinkErrorsDesc, sinkMissedDesc, sinkLagRowsDesc,
		sinkLagBytesDesc, sinkDeliveredIDDesc, sinkStateDesc} {
		ch <- d
	}
}

func (c sinkCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.s.sinkStatuses() {
		counter := func(d *prometheus.Desc, v int64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), st.Name)
		}
		gauge := func(d *prometheus.Desc, v int64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), st.Name)
		}
		counter(sinkDeliveredDesc, st.DeliveredTotal)
		counter(sinkDeadDesc, st.DeadLettered)
		counter(sinkErrorsDesc, st.Errors)
		counter(sinkMissedDesc, st.Missed)
		gauge(sinkLagRowsDesc, st.LagRows)
		gauge(sinkLagBytesDesc, st.LagBytes)
		gauge(sinkDeliveredIDDesc, st.Delivered)
		for _, state := range sinkStates {
			v := 0.0
			if st.State == state {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(sinkStateDesc, prometheus.GaugeValue, v, st.Name, state)
		}
	}
}

// sinksField keeps the sinks' source (see SetSinks).
type sinksField = atomic.Pointer[sinkSource]
