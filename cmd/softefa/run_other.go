//go:build !linux

package main

import "errors"

func runRun([]string) error {
	return errors.New("softefa run emulates the Linux kernel's uverbs interface and needs Linux")
}

func runDevice([]string) error {
	return errors.New("softefa device serves programs through the Linux kernel's uverbs interface and needs Linux")
}
