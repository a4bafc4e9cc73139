package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
)

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
