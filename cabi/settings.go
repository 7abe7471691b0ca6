//go:build linux

package cabi

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// A Setting is a setting of the device inside a program that softefa run starts: a flag of
// softefa run, which hands it to the program's engine and shim as an environment variable, the
// one way to reach a program that takes no flags of ours. docs/settings.md lists them beside
// config.Device's fields and the commands' flags.
type Setting struct {
	Flag  string // softefa run's flag, without dashes
	Env   string // the variable the program's engine or shim reads
	Kind  Kind
	Usage string
}

// Kind is how a Setting's value is written.
type Kind int

const (
	Duration Kind = iota // a Go duration: 200us, 1ms, 0
	Bool                 // 1 or 0 (true or false on the command line)
)

// Settings are the settings of softefa run's programs, in the order softefa run -h lists them.
var Settings = []Setting{
	{"rx-spin", "SOFTEFA_RXSPIN", Duration,
		"how long the engine's receive loop keeps reading without waiting after traffic (config.Device.RxSpin); default 0: never,\n" +
			"as the program busy-polls its CQ itself"},
	{"no-sparse-copies", "SOFTEFA_NO_SPARSE_COPIES", Bool,
		"no second copy, on another path, of packets sent while few are in flight after a loss (config.Device.NoSparseCopies)"},
	{"no-offload", "SOFTEFA_NO_OFFLOAD", Bool,
		"UDP GSO and GRO off: every datagram a packet of its own, as a capture needs (config.Device.NoOffload)"},
	{"debug", "SOFTEFA_DEBUG", Bool, "the shim reports its traps and counts on stderr"},
}

// EnvValue checks a flag's value against s's kind and returns what the program's environment
// gets: Go's spelling of the duration, or 1 or 0.
func (s Setting) EnvValue(v string) (string, error) {
	switch s.Kind {
	case Duration:
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return "", errors.New("want a duration of 0 or more (200us, 1ms)")
		}
		return d.String(), nil
	default:
		b, err := strconv.ParseBool(v)
		if err != nil {
			return "", errors.New("want true or false")
		}
		if b {
			return "1", nil
		}
		return "0", nil
	}
}

// EnvDuration reads the Duration setting env from the environment: ok is false when it is unset,
// err names the variable when its value is not a duration of 0 or more.
func EnvDuration(env string) (d time.Duration, ok bool, err error) {
	v, ok := os.LookupEnv(env)
	if !ok {
		return 0, false, nil
	}
	d, err = time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, false, fmt.Errorf("%s=%q: want a duration of 0 or more (200us, 1ms)", env, v)
	}
	return d, true, nil
}

// EnvBool reads the Bool setting env: true for 1 (or anything strconv.ParseBool takes for true),
// false when unset or empty; err names the variable when its value is neither.
func EnvBool(env string) (bool, error) {
	v := os.Getenv(env)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s=%q: want 1 or 0", env, v)
	}
	return b, nil
}
