package server

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Command runs the server's command line (the service, or the consume
// subcommand) and returns the exit code: 0 for success, 2 for a bad command
// line or configuration, 1 for a failure at run time.
func Command(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "consume":
			return consumeCommand(args[1:], stdout, stderr)
		case "produce":
			return produceCommand(args[1:], os.Stdin, stdout, stderr)
		case "version", "--version", "-version":
			fmt.Fprintln(stdout, Version())
			return 0
		}
	}
	cfg, err := ParseConfig(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		usage(stdout)
		return 0
	}
	if err != nil {
		return badUsage(stderr, err)
	}
	logger, err := newLogger(cfg, stderr)
	if err != nil {
		return badUsage(stderr, err)
	}
	TuneGC()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal now ends the process at once
		logger.Info("shutting down: committing the batch in hand", "grace", cfg.Grace)
		time.Sleep(cfg.Grace)
		logger.Error("shutdown grace period passed: exiting")
		os.Exit(1)
	}()
	m := NewMain(cfg, logger)
	if err := m.Run(ctx); err != nil {
		logger.Error("server failed", "err", err)
		return 1
	}
	return 0
}

// DefaultGOGC is the garbage collector's target outboxd runs with unless
// GOGC is set: the heap may grow to three times the live data, not two.
// Most of outboxd's garbage is short-lived batch buffers, so this halves the
// collector's CPU for a few tens of MiB (server bench: end_to_end +10-15%,
// peak RSS 69 -> 87 MiB).
const DefaultGOGC = 200

// TuneGC applies DefaultGOGC when the environment does not set GOGC, and
// returns the GOGC in effect.
func TuneGC() int {
	if v, ok := os.LookupEnv("GOGC"); ok {
		if strings.EqualFold(v, "off") {
			return -1
		}
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
		return 100 // the runtime ignores a GOGC it cannot parse
	}
	debug.SetGCPercent(DefaultGOGC)
	return DefaultGOGC
}

// badUsage prints err on one line and returns exit code 2.
func badUsage(stderr io.Writer, err error) int {
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	fmt.Fprintf(stderr, "server: %s (see server -h)\n", msg)
	return 2
}

func newLogger(cfg Config, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %q is not one of debug, info, warn, error", cfg.LogLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch cfg.LogFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format: %q is not one of text, json", cfg.LogFormat)
	}
}
