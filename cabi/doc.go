//go:build linux

// Package cabi runs unmodified programs built against rdma-core (libibverbs and libefa) on a
// softefa device, by emulating the kernel underneath them (docs/cabi.md): a C preload shim
// (shim/preload.c) intercepts the device node's open, stat, ioctl, write and close, and maps the
// device's /sys and /dev paths into the process's tree (shim/paths.c); the Go engine,
// built as a C shared library (libengine), answers the uverbs commands with package
// internal/uverbs; a generated sysfs tree, named by SYSFS_PATH, makes libibverbs find the device.
//
// This package builds the two libraries (Build), writes the sysfs tree (Sysfs) and prepares a
// program's environment (Setup); softefa run is its command-line front end. cgo is used only by
// the engine library in libengine.
package cabi
