package server

import (
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/outboxd/outboxd/api"
)

// deadLettersSynopsis is the dead-letters command's usage.
const deadLettersSynopsis = `dead-letters list FEED [--reason R] [--open] [--limit N] [--after ID]
       dead-letters show FEED ID [--payload]
       dead-letters requeue FEED ID [--payload TEXT | --payload-file FILE] [--note WHY]
       dead-letters requeue FEED --reason R [--note WHY]        (every open one of the reason)
       dead-letters discard FEED ID --note WHY
       dead-letters discard FEED --reason R --note WHY          (every open one of the reason)
  (each with [--url URL] [--token T] [--json])`

// deadLettersCommand lists, shows, requeues and discards a feed's dead
// letters through the server's API (a read token lists and shows; an
// admin token requeues and discards).
func deadLettersCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			helpOf(stdout, "dead-letters", deadLettersSynopsis, apiFlagSet())
			return ExitOK
		}
		return apiUsage(stderr, "dead-letters", fmt.Errorf("want list, show, requeue or discard (see %s dead-letters -h)", cliName()))
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("dead-letters "+sub, flag.ContinueOnError)
	var af apiFlags
	af.register(fs, true)
	var o dlOptions
	want, optional := []string{"FEED", "ID"}, 0
	switch sub {
	case "list":
		fs.StringVar(&o.reason, "reason", "", "only the dead letters of this `REASON` (malformed, line-too-long, ...)")
		fs.BoolVar(&o.open, "open", false, "only those no one requeued or discarded")
		fs.IntVar(&o.limit, "limit", 100, "print at most `N`")
		fs.Int64Var(&o.after, "after", 0, "start after dead letter `ID`")
		want = []string{"FEED"}
	case "show":
		fs.BoolVar(&o.payload, "payload", false, "print the whole payload only, as stored (bytes)")
	case "requeue":
		fs.StringVar(&o.reason, "reason", "", "requeue every open dead letter of this `REASON` (instead of an ID)")
		fs.StringVar(&o.edit, "payload", "", "apply this `TEXT` instead of the stored payload")
		fs.StringVar(&o.editFile, "payload-file", "", "apply the bytes of `FILE` instead of the stored payload")
		fs.StringVar(&o.note, "note", "", "why (recorded with the dead letter)")
		optional = 1
	case "discard":
		fs.StringVar(&o.reason, "reason", "", "discard every open dead letter of this `REASON` (instead of an ID)")
		fs.StringVar(&o.note, "note", "", "why (required; recorded with the dead letter)")
		optional = 1
	default:
		return apiUsage(stderr, "dead-letters", fmt.Errorf("%q: want list, show, requeue or discard%s", sub, closestOf(sub, "list", "show", "requeue", "discard")))
	}
	pos, code, done := parseAPICommand(fs, args, deadLettersSynopsis, want, optional, stdout, stderr)
	if done {
		return code
	}
	o.feed = pos[0]
	if len(pos) > 1 {
		id, err := strconv.ParseInt(pos[1], 10, 64)
		if err != nil || id < 1 {
			return apiUsage(stderr, fs.Name(), fmt.Errorf("dead letter id %q: want a positive integer", pos[1]))
		}
		o.id = id
	}
	if err := o.check(sub); err != nil {
		return apiUsage(stderr, fs.Name(), err)
	}
	c, err := af.client(os.Getenv)
	if err != nil {
		return apiUsage(stderr, fs.Name(), err)
	}
	ctx, stop := withTimeout(ctx, af.timeout)
	defer stop()
	run := map[string]func(context.Context, *apiClient, dlOptions, bool, io.Writer) error{
		"list": listDeadLetters, "show": showDeadLetter, "requeue": requeueDeadLetters, "discard": discardDeadLetters,
	}[sub]
	if err := run(ctx, c, o, af.json, stdout); err != nil {
		return apiFailed(stderr, fs.Name(), err)
	}
	return ExitOK
}

// dlOptions are a dead-letters command's arguments.
type dlOptions struct {
	feed           string
	id             int64
	reason, note   string
	open, payload  bool
	limit          int
	after          int64
	edit, editFile string
}

// check says what does not go together.
func (o dlOptions) check(sub string) error {
	switch {
	case (sub == "requeue" || sub == "discard") && (o.id == 0) == (o.reason == ""):
		return fmt.Errorf("give a dead letter ID or --reason R, one of the two")
	case sub == "discard" && o.note == "":
		return fmt.Errorf("--note WHY is required: a discard is recorded with why")
	case sub == "requeue" && o.edit != "" && o.editFile != "":
		return fmt.Errorf("--payload and --payload-file: give one")
	case sub == "requeue" && o.reason != "" && (o.edit != "" || o.editFile != ""):
		return fmt.Errorf("--payload edits one dead letter: give its ID, not --reason")
	case sub == "list" && (o.limit < 1 || o.after < 0):
		return fmt.Errorf("--limit %d, --after %d: want a positive limit and a non-negative id", o.limit, o.after)
	}
	return nil
}

// listDeadLetters prints the dead letters a page at a time, up to the
// limit.
func listDeadLetters(ctx context.Context, c *apiClient, o dlOptions, raw bool, w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if !raw {
		fmt.Fprintln(tw, "ID\tREASON\tRESOLUTION\tAT\tPOSITION\tATTEMPTS\tPAYLOAD")
	}
	after, left, n := o.after, o.limit, 0
	for left > 0 {
		q := url.Values{"after": {strconv.FormatInt(after, 10)}, "limit": {strconv.Itoa(min(left, api.MaxDeadLetterLimit))}}
		if o.reason != "" {
			q.Set("reason", o.reason)
		}
		if o.open {
			q.Set("open", "true")
		}
		var page api.DeadLetterPage
		b, err := c.getJSON(ctx, feedPath(o.feed)+"/dead-letters?"+q.Encode(), &page)
		if err != nil {
			return err
		}
		if raw {
			w.Write(b)
		}
		for _, dl := range page.DeadLetters {
			n++
			if !raw {
				res := dl.Resolution
				if dl.ResolvedBy != "" {
					res += " by " + dl.ResolvedBy
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d:%d\t%d\t%s\n", dl.ID, dl.Reason, res, dl.At.Format("2006-01-02 15:04:05"),
					dl.Delivery.Partition, dl.Delivery.Position, dl.Attempts, previewOf(dl, 60))
			}
		}
		left -= len(page.DeadLetters)
		if page.Next == nil {
			break
		}
		after = *page.Next
	}
	if !raw {
		tw.Flush()
		fmt.Fprintf(w, "%d dead letters\n", n)
	}
	return nil
}

// previewOf is a dead letter's payload as one quoted line of at most n
// characters (Go's quoting: spaces and tabs stay readable, nothing breaks
// the line).
func previewOf(dl api.DeadLetterJSON, n int) string {
	p := dl.Payload
	if dl.PayloadEncoding == api.EncodingBase64 {
		p = "(base64) " + p
	}
	cut := dl.PayloadTruncated
	if r := []rune(p); len(r) > n {
		p, cut = string(r[:n]), true
	}
	q := strconv.Quote(p)
	if cut {
		q += fmt.Sprintf("… (%d bytes)", dl.PayloadBytes)
	}
	return q
}

// showDeadLetter prints one dead letter whole: its fields, then its whole
// payload (or only the payload's bytes with --payload).
func showDeadLetter(ctx context.Context, c *apiClient, o dlOptions, raw bool, w io.Writer) error {
	path := fmt.Sprintf("%s/dead-letters/%d", feedPath(o.feed), o.id)
	if o.payload {
		b, err := c.do(ctx, "GET", path+"/payload", nil)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	var dl api.DeadLetterJSON
	b, err := c.getJSON(ctx, path, &dl)
	if err != nil {
		return err
	}
	if raw {
		_, err = w.Write(b)
		return err
	}
	payload, err := c.do(ctx, "GET", path+"/payload", nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "dead letter %d of %s\n", dl.ID, o.feed)
	fmt.Fprintf(w, "  reason:     %s\n  error:      %s\n  attempts:   %d\n  at:         %s\n", dl.Reason, dl.Error, dl.Attempts, dl.At.Format("2006-01-02 15:04:05.000Z07:00"))
	fmt.Fprintf(w, "  delivery:   partition %d, position %d, epoch %s\n", dl.Delivery.Partition, dl.Delivery.Position, dl.Delivery.Epoch)
	res := dl.Resolution
	if dl.ResolvedBy != "" {
		res += " by " + dl.ResolvedBy
	}
	if dl.Note != "" {
		res += ": " + dl.Note
	}
	if dl.RequeueEdited {
		res += " (with an edited payload)"
	}
	fmt.Fprintf(w, "  resolution: %s\n", res)
	if dl.KeyBytes > 0 {
		fmt.Fprintf(w, "  key:        %s\n", strconv.Quote(dl.Key))
	}
	for _, h := range dl.Headers {
		fmt.Fprintf(w, "  header:     %s=%s\n", strconv.Quote(h.Key), strconv.Quote(h.Value))
	}
	fmt.Fprintf(w, "  payload:    %d bytes\n%s\n", len(payload), quoteBytes(payload))
	return nil
}

// quoteBytes is a payload for a terminal: quoted text, or base64 for bytes
// that are not text.
func quoteBytes(b []byte) string {
	s, enc := string(b), api.EncodingUTF8
	if !utf8.Valid(b) {
		s, enc = base64.StdEncoding.EncodeToString(b), api.EncodingBase64
	}
	if enc == api.EncodingBase64 {
		return "(base64) " + s
	}
	return strconv.Quote(s)
}

// requeueDeadLetters requeues one dead letter (edited, maybe) or every
// open one of a reason, going on until each was tried.
func requeueDeadLetters(ctx context.Context, c *apiClient, o dlOptions, raw bool, w io.Writer) error {
	if o.reason == "" {
		req := api.RequeueRequest{Note: o.note}
		if o.editFile != "" {
			b, err := os.ReadFile(o.editFile)
			if err != nil {
				return fmt.Errorf("--payload-file: %w", err)
			}
			s := base64.StdEncoding.EncodeToString(b)
			req.Payload, req.PayloadEncoding = &s, api.EncodingBase64
		} else if o.edit != "" {
			req.Payload = &o.edit
		}
		return postAnswer(ctx, c, fmt.Sprintf("%s/dead-letters/%d/requeue", feedPath(o.feed), o.id), req, raw, w,
			func(res api.RequeueResult) string {
				return fmt.Sprintf("dead letter %d of %s: %s", o.id, o.feed, res.Message)
			})
	}
	var total api.RequeueAllResult
	after := int64(0)
	for {
		q := url.Values{"reason": {o.reason}, "after": {strconv.FormatInt(after, 10)}}
		var res api.RequeueAllResult
		b, err := c.postJSON(ctx, feedPath(o.feed)+"/dead-letters/requeue?"+q.Encode(), map[string]string{"note": o.note}, &res)
		if err != nil {
			return err
		}
		if raw {
			w.Write(b)
		}
		total.Requeued += res.Requeued
		total.Failed += res.Failed
		total.Failures = append(total.Failures, res.Failures...)
		if res.Next == nil {
			break
		}
		after = *res.Next
	}
	if !raw {
		fmt.Fprintf(w, "%s dead letters of %s: %d requeued, %d failed again (they stay open)\n", o.reason, o.feed, total.Requeued, total.Failed)
		for _, f := range total.Failures {
			fmt.Fprintf(w, "  %d: %s\n", f.ID, f.Error)
		}
	}
	return nil
}

// discardDeadLetters discards one dead letter, or every open one of a
// reason.
func discardDeadLetters(ctx context.Context, c *apiClient, o dlOptions, raw bool, w io.Writer) error {
	body := api.DiscardRequest{Note: o.note}
	if o.reason != "" {
		return postAnswer(ctx, c, feedPath(o.feed)+"/dead-letters/discard?reason="+url.QueryEscape(o.reason), body, raw, w,
			func(res api.DiscardAllResult) string {
				return fmt.Sprintf("%s dead letters of %s: %d discarded", o.reason, o.feed, res.Discarded)
			})
	}
	return postAnswer(ctx, c, fmt.Sprintf("%s/dead-letters/%d/discard", feedPath(o.feed), o.id), body, raw, w,
		func(res api.DiscardResult) string {
			return fmt.Sprintf("dead letter %d of %s: %s", o.id, o.feed, res.Message)
		})
}

// postAnswer posts body to path and writes the answer to w: as the server
// sent it (raw), or the line line makes of it.
func postAnswer[T any](ctx context.Context, c *apiClient, path string, body any, raw bool, w io.Writer, line func(T) string) error {
	var res T
	b, err := c.postJSON(ctx, path, body, &res)
	if err != nil {
		return err
	}
	if raw {
		_, err = w.Write(b)
		return err
	}
	_, err = fmt.Fprintln(w, line(res))
	return err
}
