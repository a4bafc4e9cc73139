// Package docker_test checks contrib/docker/Dockerfile with BuildKit's own
// parser and linter (the checks of docker build --check that need no
// daemon), and what outboxd's image must be: its final stage distroless or
// scratch, run as a user that is not root, its entrypoint in exec form.
// It is a module of its own, so that BuildKit is no dependency of
// outboxd's.
package docker_test

import (
	"os"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

func TestDockerfile(t *testing.T) {
	f, err := os.Open("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	for _, w := range res.Warnings {
		t.Errorf("parser warning: %s", w.Short)
	}
	var lints []string
	lint := linter.New(&linter.Config{Warn: func(rule, desc, url, msg string, _ []parser.Range) {
		lints = append(lints, rule+": "+msg)
	}})
	stages, _, err := instructions.Parse(res.AST, lint)
	if err != nil {
		t.Fatalf("instructions: %v", err)
	}
	for _, l := range lints {
		t.Errorf("lint: %s", l)
	}
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a build stage and the image", len(stages))
	}
	final := stages[len(stages)-1]
	if !strings.HasPrefix(final.BaseName, "gcr.io/distroless/") && final.BaseName != "scratch" {
		t.Errorf("the image is based on %s, want distroless or scratch", final.BaseName)
	}
	var user string
	var entry *instructions.EntrypointCommand
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.EntrypointCommand:
			entry = c
		case *instructions.AddCommand:
			t.Errorf("ADD in the image (%s): COPY from the build stage", c.String())
		}
	}
	if name, _, _ := strings.Cut(user, ":"); name == "" || name == "root" || name == "0" {
		t.Errorf("the image runs as %q, want a user that is not root", user)
	}
	if entry == nil || entry.PrependShell {
		t.Errorf("the entrypoint %v: want the exec (JSON) form, so the server gets SIGTERM itself", entry)
	} else if entry.CmdLine[0] != "/usr/local/bin/outboxd" {
		t.Errorf("the entrypoint runs %s", entry.CmdLine[0])
	}
	// The build stage uses the Go of outboxd's go.mod.
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var goLine string
	for _, l := range strings.Split(string(gomod), "\n") {
		if v, ok := strings.CutPrefix(l, "go "); ok {
			goLine = v
		}
	}
	if minor := strings.Join(strings.Split(goLine, ".")[:2], "."); !strings.HasPrefix(stages[0].BaseName, "golang:"+minor) {
		t.Errorf("the build stage is %s, want golang:%s (go.mod says go %s)", stages[0].BaseName, minor, goLine)
	}
}
