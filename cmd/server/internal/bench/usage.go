package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// clockTick is the unit of /proc/PID/stat's CPU times: USER_HZ, 100 on
// every Linux the bench runs on.
const clockTick = 10 * time.Millisecond

// procCPU is a process's user and system CPU time so far, from
// /proc/PID/stat (0 where there is no /proc).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: fields are
	// counted after its closing parenthesis. utime and stime are the 14th
	// and 15th fields, the 12th and 13th after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	st, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(ut+st) * clockTick
}

// selfCPU is this process's user and system CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procPeakMiB is a process's peak resident memory (VmHWM), 0 when unknown.
func procPeakMiB(pid int) float64 {
	v, err := readStatusMiB("/proc/"+strconv.Itoa(pid)+"/status", "VmHWM")
	if err != nil {
		return 0
	}
	return v
}

// resetSelfPeak starts this process's peak resident memory over from its
// current size (Linux: writing 5 to clear_refs), so that a phase's peak is
// its own. It reports whether it could.
func resetSelfPeak() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// cpuSpan measures CPU time between start and end: the process whose work
// is measured and the broker child.
type cpuSpan struct {
	pid        int // 0: this process
	brokerPID  int // 0: none (a given cluster, or an in-process broker)
	proc, brok time.Duration
}

func (c *cpuSpan) now() (proc, brok time.Duration) {
	if c.pid == 0 {
		proc = selfCPU()
	} else {
		proc = procCPU(c.pid)
	}
	if c.brokerPID != 0 {
		brok = procCPU(c.brokerPID)
	}
	return proc, brok
}

// start takes the first reading.
func (c *cpuSpan) start() { c.proc, c.brok = c.now() }

// since is the CPU used since start: the process's and the broker's.
func (c *cpuSpan) since() (proc, brok time.Duration) {
	p, b := c.now()
	return p - c.proc, b - c.brok
}

// cpuResult is a phase's CPU time, in seconds and per item.
type cpuResult struct {
	ProcessSeconds float64 `json:"process_seconds"`
	BrokerSeconds  float64 `json:"broker_seconds"`
	// PerItemUS is process plus broker CPU per item, in microseconds.
	PerItemUS        float64 `json:"per_item_us"`
	ProcessPerItemUS float64 `json:"process_per_item_us"`
}

func newCPUResult(proc, brok time.Duration, items int64) *cpuResult {
	if items <= 0 {
		return nil
	}
	us := func(d time.Duration) float64 { return round3(float64(d.Nanoseconds()) / 1e3 / float64(items)) }
	return &cpuResult{ProcessSeconds: round3(proc.Seconds()), BrokerSeconds: round3(brok.Seconds()),
		PerItemUS: us(proc + brok), ProcessPerItemUS: us(proc)}
}

func (c *cpuResult) String() string {
	if c == nil {
		return ""
	}
	return fmt.Sprintf("%.2f us", c.PerItemUS)
}
