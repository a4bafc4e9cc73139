package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// rssEvery is how often the resident memory is sampled during a phase.
const rssEvery = 50 * time.Millisecond

// rssWindow is what the samples of one stretch of time show, in MiB.
// Memory that stays flat has the same maximum in both halves; one that
// grows with the work done has a larger one in the second.
type rssWindow struct {
	StartMiB, MaxMiB, EndMiB float64
	FirstHalfMaxMiB          float64
	SecondHalfMaxMiB         float64
	Samples                  int
}

// rssSampler samples this process's resident memory (VmRSS in
// /proc/self/status) until finished. Where there is no /proc it samples
// nothing.
type rssSampler struct {
	stop chan struct{}
	done chan struct{}
	w    rssWindow
	all  []float64 // every sample, for the halves
}

// startRSS starts sampling now and then every interval.
func startRSS(every time.Duration) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go s.run(every)
	return s
}

func (s *rssSampler) run(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.sample()
		select {
		case <-s.stop:
			s.sample()
			return
		case <-t.C:
		}
	}
}

func (s *rssSampler) sample() {
	v, err := readStatusMiB("/proc/self/status", "VmRSS")
	if err != nil {
		return
	}
	if s.w.Samples == 0 {
		s.w.StartMiB = v
	}
	s.w.Samples++
	s.w.MaxMiB = max(s.w.MaxMiB, v)
	s.w.EndMiB = v
	s.all = append(s.all, v)
}

// finish takes a last sample, stops and returns the window.
func (s *rssSampler) finish() rssWindow {
	close(s.stop)
	<-s.done
	s.w.FirstHalfMaxMiB, s.w.SecondHalfMaxMiB = halfMaxima(s.all)
	return s.w
}

// halfMaxima returns the largest sample of the first half of samples and
// of the second (which holds the middle one of an odd count).
func halfMaxima(samples []float64) (first, second float64) {
	half := len(samples) / 2
	for i, v := range samples {
		if i < half {
			first = max(first, v)
		} else {
			second = max(second, v)
		}
	}
	return first, second
}

// readStatusMiB reads a "Field:   N kB" line of a /proc/PID/status file,
// in MiB.
func readStatusMiB(path, field string) (float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	prefix := []byte(field + ":")
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := bytes.CutPrefix(sc.Bytes(), prefix)
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(string(bytes.TrimSpace(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte("kB")))), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read %s: %s: %w", path, field, err)
		}
		return round1(float64(kb) / 1024), nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	return 0, fmt.Errorf("read %s: no %s", path, field)
}
