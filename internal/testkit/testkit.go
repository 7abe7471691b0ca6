// Package testkit holds the test helpers that the tests of packages verbs and efadv share: a
// device and a context closed (and checked) when the test ends, and the small assertions every
// API test makes. It is for tests only.
package testkit

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/verbs"
)

// Device makes a device (mod may change its configuration first) that closes when the test
// ends; an error closing it fails the test.
func Device(t testing.TB, mod func(*config.Device)) *verbs.Device {
	t.Helper()
	var cfg config.Device
	if mod != nil {
		mod(&cfg)
	}
	d, err := verbs.NewDevice(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("device close: %v", err)
		}
	})
	return d
}

// Context opens a context on d that closes when the test ends; an error closing it (objects
// left open) fails the test.
func Context(t testing.TB, d *verbs.Device) *verbs.Context {
	t.Helper()
	ctx, err := d.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ctx.Close(); err != nil {
			t.Errorf("context close: %v", err)
		}
	})
	return ctx
}

// WantErrno fails the test unless err is want.
func WantErrno(t testing.TB, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("err = %v, want %v", err, want)
	}
}

// Check reports a non-nil err as a failure and lets the test go on.
func Check(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Error(err)
	}
}

// Must returns a function that returns v, or stops the test if err is not nil:
// testkit.Must[*verbs.PD](t)(ctx.AllocPD()).
func Must[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// NoPanic runs f and reports a panic as an error, so that a table of calls goes on past it.
func NoPanic(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return f()
}
