package server

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// Exit codes of Command.
const (
	// ExitOK: the server ran and shut down cleanly (after SIGINT or
	// SIGTERM, at any moment, also while it was starting).
	ExitOK = 0
	// ExitFailed: a failure at run time, such as the database file
	// deleted or replaced under the server.
	ExitFailed = 1
	// ExitConfig: the configuration cannot be used (a bad flag or key, an
	// input that cannot be read, a port in use, a new database where an
	// earlier one published). Found before the server claims its
	// database, so a server already running on it is untouched.
	ExitConfig = 2
	// ExitFenced: another server claimed the database, and this one
	// stopped. Restarting it automatically would take the database back
	// and stop the other in turn.
	ExitFenced = 3
)

// Run is a whole main: the server's command line of os.Args[1:] on the
// process's standard output and error, with opts (the caller's own
// processors, WithProcessor). It returns the exit code for os.Exit:
//
//	func main() { os.Exit(server.Run(server.WithProcessor("counter", newCounter))) }
func Run(opts ...Option) int {
	return Command(os.Args[1:], os.Stdout, os.Stderr, opts...)
}

// Command runs the server's command line (the service, or the consume
// subcommand) and returns its exit code (ExitOK, ExitConfig, ...). opts
// register the caller's own processors (WithProcessor). It catches SIGINT
// and SIGTERM first thing; see CommandSignals.
func Command(args []string, stdout, stderr io.Writer, opts ...Option) int {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	return CommandSignals(args, stdout, stderr, sigs, opts...)
}

// CommandSignals is Command for a caller that already catches SIGINT and
// SIGTERM on sigs (the binary does from its first moments). The first
// signal, whenever it comes, stops the service cleanly: a server still
// starting stops starting, without claiming the database if it had not
// yet; a running one commits the batch in hand. It exits within the
// shutdown grace period (ExitFailed past it); a second signal exits at
// once with 128 plus the signal's number.
func CommandSignals(args []string, stdout, stderr io.Writer, sigs <-chan os.Signal, opts ...Option) int {
	sd := watchSignals(sigs, stderr)
	defer sd.close()
	if len(args) > 0 {
		switch args[0] {
		case "consume":
			return consumeCommand(sd.ctx, args[1:], stdout, stderr)
		case "config":
			return configCommand(args[1:], stdout, stderr, opts...)
		case "produce":
			return produceCommand(sd.ctx, args[1:], os.Stdin, stdout, stderr)
		case "replay":
			return replayCommand(sd.ctx, args[1:], stdout, stderr, opts...)
		case "test":
			return testCommand(sd.ctx, args[1:], stdout, stderr, opts...)
		case "status":
			return statusCommand(sd.ctx, args[1:], stdout, stderr)
		case "dead-letters":
			return deadLettersCommand(sd.ctx, args[1:], stdout, stderr)
		case "losses":
			return lossesCommand(sd.ctx, args[1:], stdout, stderr)
		case "topics":
			return topicsCommand(sd.ctx, args[1:], stdout, stderr)
		case "version", "--version", "-version":
			fmt.Fprintln(stdout, Version())
			return 0
		case "help":
			usage(stdout)
			return ExitOK
		case "bench":
			return badUsage(stderr, errors.New("bench: this program has no bench; the outboxd binary (cmd/server) does"))
		}
		if !strings.HasPrefix(args[0], "-") {
			return badUsage(stderr, unknownCommand(args[0]))
		}
	}
	cfg, err := ParseConfig(args, os.Getenv, opts...)
	if errors.Is(err, flag.ErrHelp) {
		usage(stdout)
		return ExitOK
	}
	if err != nil {
		return badUsage(stderr, err)
	}
	logger, err := newLogger(cfg, stderr)
	if err != nil {
		return badUsage(stderr, err)
	}
	// The first line the server writes (at debug level, so that a bad
	// configuration found next still prints a single line).
	logger.Debug("outboxd starting", "pid", os.Getpid())
	for _, w := range cfg.Warnings() {
		logger.Warn(w)
	}
	warnUnknownEnv(logger, os.Environ())
	if len(cfg.Feeds) == 0 {
		logger.Warn("no feeds: the server runs and reads nothing; give one, e.g. " + noFeedExample())
	}
	sd.arm(logger, cfg.Grace)
	TuneGC()
	if limit := TuneMemory(len(cfg.Feeds)); limit > 0 {
		logger.Debug("Go memory limit", "bytes", limit)
	}
	return exitCode(NewMain(cfg, logger).Run(sd.ctx), logger, stderr)
}

// exitCode reports err and returns the exit code it means.
func exitCode(err error, logger *slog.Logger, stderr io.Writer) int {
	var ce *ConfigError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ce):
		fmt.Fprintf(stderr, "%s: %s\n", programName, oneLine(ce.Error()))
		return ExitConfig
	case errors.Is(err, outbox.ErrMoved):
		logger.Error("the database file was deleted or replaced under the server: stopping; everything it committed "+
			"since went to a file no one will open again", "err", err)
		return ExitFailed
	case errors.Is(err, outbox.ErrFenced), errors.Is(err, relay.ErrFenced):
		logger.Error("another server took over this database: stopping", "err", err)
		return ExitFenced
	default:
		logger.Error("server failed", "err", err)
		return ExitFailed
	}
}

// DefaultGOGC is the garbage collector's target outboxd runs with unless
// GOGC is set: the heap may grow to three times the live data, not two.
// Most of outboxd's garbage is short-lived batch buffers, so this halves the
// collector's CPU for a few tens of MiB (figures: docs/performance.md).
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

// Memory the Go runtime aims to stay within unless GOMEMLIMIT is set:
// MemoryLimitBase plus MemoryLimitPerFeed for each feed. A feed's batch of
// items and outputs and its processor's cache (the ledger's holds 32 MiB of
// balances) fit in its share; the base holds the store's recent rows (24
// MiB), the relay's batch and the rest. The limit is soft: near it the
// collector runs more often (never more than half the CPU) instead of
// letting GOGC's headroom triple the heap, so the process's peak RSS stays
// within a bound that does not depend on how much garbage a batch makes
// (server bench, orders at 1,000 and 1,000,000 open orders: 219.0 / 250.6
// MiB without it, 198.2 / 213.0 MiB with 128 MiB).
const (
	MemoryLimitBase    = 64 << 20
	MemoryLimitPerFeed = 64 << 20
)

// MemoryLimit is the default soft memory limit of a server of feeds feeds
// (at least one).
func MemoryLimit(feeds int) int64 {
	return int64(MemoryLimitBase) + int64(max(feeds, 1))*MemoryLimitPerFeed
}

// TuneMemory sets MemoryLimit(feeds) as the Go runtime's soft memory limit
// when the environment does not set GOMEMLIMIT, and returns it (0 when
// GOMEMLIMIT is set, which the runtime applies itself).
func TuneMemory(feeds int) int64 {
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok && v != "" {
		return 0
	}
	limit := MemoryLimit(feeds)
	debug.SetMemoryLimit(limit)
	return limit
}

// noFeedExample is the command the no-feed warning suggests.
func noFeedExample() string {
	return programName + " --feed ledger=file:./ledger.csv --processor ledger=ledger (or a feeds: section in the file of --config)"
}

// programName is the program's own name, the base of os.Args[0], as help
// and errors say it (a program built on package server has its own).
var programName = func() string {
	if len(os.Args) == 0 || os.Args[0] == "" {
		return "outboxd"
	}
	return filepath.Base(os.Args[0])
}()

// badUsage prints err on one line (each of ConfigErrors on one of its
// own) and returns ExitConfig.
func badUsage(stderr io.Writer, err error) int {
	var ce ConfigErrors
	if errors.As(err, &ce) {
		for _, e := range ce[:len(ce)-1] {
			fmt.Fprintf(stderr, "%s: %s\n", programName, oneLine(e.Error()))
		}
		err = ce[len(ce)-1]
	}
	fmt.Fprintf(stderr, "%s: %s (see %s -h)\n", programName, oneLine(err.Error()), programName)
	return ExitConfig
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", "; ") }

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
