package api

import (
	"github.com/prometheus/client_golang/prometheus"
)

// RecordingStatus is a feed's recording (the server's --record): whether
// it is writing, to which file, how much.
type RecordingStatus struct {
	Recording bool   `json:"recording"`
	File      string `json:"file"`
	// Bytes counts what the feed's recording wrote since the server
	// started, in every file (Files of them).
	Bytes int64  `json:"bytes"`
	Files int    `json:"files"`
	Error string `json:"error"`
}

// Recorded is implemented by a Feed that may be recorded. Recording
// returns nil when it is not. It must be safe for concurrent use and not
// block.
type Recorded interface {
	Recording() *RecordingStatus
}

// recordingOf is f's recording, nil when f is not recorded (or nil).
func recordingOf(f Feed) *RecordingStatus {
	if r, ok := f.(Recorded); ok {
		return r.Recording()
	}
	return nil
}

// Metric names of recordings.
const (
	MetricFeedRecording      = "outboxd_feed_recording"
	MetricFeedRecordingBytes = "outboxd_feed_recording_bytes"
)

// recordingCollector reports each recorded feed's recording.
type recordingCollector struct {
	s            *Server
	active, size *prometheus.Desc
}

func newRecordingCollector(s *Server) *recordingCollector {
	return &recordingCollector{
		s: s,
		active: prometheus.NewDesc(MetricFeedRecording,
			"1 while the feed's recording writes, 0 once it stopped (its error is in the feed's status).", []string{"feed"}, nil),
		size: prometheus.NewDesc(MetricFeedRecordingBytes,
			"Bytes the feed's recording wrote since the server started, in every file.", []string{"feed"}, nil),
	}
}

// Describe sends the descriptors.
func (c *recordingCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.active
	ch <- c.size
}

// Collect reports the recorded feeds.
func (c *recordingCollector) Collect(ch chan<- prometheus.Metric) {
	for name, f := range c.s.feeds {
		r := recordingOf(f)
		if r == nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.active, prometheus.GaugeValue, bool01(r.Recording), name)
		ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(r.Bytes), name)
	}
}
