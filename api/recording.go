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
	// DiskBytes is what the feed's recordings (parts and snapshots) hold
	// on disk, as last counted.
	DiskBytes int64 `json:"diskBytes"`
	// Paused, when not "", says the recording is paused at its total cap
	// (--record-max-total-bytes) and why: the feed goes on unrecorded
	// until retention frees room.
	Paused string `json:"paused"`
	// RemovedFiles and RemovedBytes count what retention removed since
	// the server started.
	RemovedFiles int   `json:"removedFiles"`
	RemovedBytes int64 `json:"removedBytes"`
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
	// MetricFeedRecordingDiskBytes is what the recordings hold on disk,
	// MetricFeedRecordingPaused 1 while the recorder is paused at its cap.
	MetricFeedRecordingDiskBytes = "outboxd_feed_recording_disk_bytes"
	MetricFeedRecordingPaused    = "outboxd_feed_recording_paused"
)

// recordingCollector reports each recorded feed's recording.
type recordingCollector struct {
	s                          *Server
	active, size, disk, paused *prometheus.Desc
}

func newRecordingCollector(s *Server) *recordingCollector {
	return &recordingCollector{
		s: s,
		active: prometheus.NewDesc(MetricFeedRecording,
			"1 while the feed's recording writes, 0 once it stopped (its error is in the feed's status).", []string{"feed"}, nil),
		size: prometheus.NewDesc(MetricFeedRecordingBytes,
			"Bytes the feed's recording wrote since the server started, in every file.", []string{"feed"}, nil),
		disk: prometheus.NewDesc(MetricFeedRecordingDiskBytes,
			"Bytes the feed's recordings (parts and snapshots) hold on disk, after retention.", []string{"feed"}, nil),
		paused: prometheus.NewDesc(MetricFeedRecordingPaused,
			"1 while the feed's recorder is paused at its total cap (--record-max-total-bytes); the feed goes on unrecorded.", []string{"feed"}, nil),
	}
}

// Describe sends the descriptors.
func (c *recordingCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.active
	ch <- c.size
	ch <- c.disk
	ch <- c.paused
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
		ch <- prometheus.MustNewConstMetric(c.disk, prometheus.GaugeValue, float64(r.DiskBytes), name)
		ch <- prometheus.MustNewConstMetric(c.paused, prometheus.GaugeValue, bool01(r.Paused != ""), name)
	}
}
