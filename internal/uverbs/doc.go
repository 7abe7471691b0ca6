//go:build linux

// Package uverbs is the kernel side of softefa's C ABI: it answers the uverbs write() commands
// that the real libibverbs and libefa send to /dev/infiniband/uverbsN, with EFA's driver data,
// by calling the device engine (package internal/engine). It is what the Linux kernel's
// ib_uverbs module plus the EFA driver do, for one device in the calling process.
//
// A File is one open of the device node: a ucontext. Its Write takes the bytes a program wrote
// (ib_uverbs_cmd_hdr, the optional ib_uverbs_ex_cmd_hdr, the command and its driver data) and
// returns the byte count or the errno the kernel would return (uverbs_main.c ib_uverbs_write,
// verify_hdr; uverbs_cmd.c; efa_verbs.c). Responses are copied to the addresses the command
// names through Memory, the process's address space, so a bad address is EFAULT.
//
// Rings and doorbell pages live in Regions: page-aligned ranges of the command fd's mmap space
// (a memfd in package cabi), whose offsets are the mmap keys libefa passes to mmap(2). The engine
// gets slices of the same memory, so the rings libefa writes are the engine's rings.
//
// Source: rdma-core v44 kernel-headers/rdma/ib_user_verbs.h and efa-abi.h for the layouts; the
// kernel's drivers/infiniband/core/uverbs_{main,cmd}.c and hw/efa/efa_verbs.c for the checks.
//
// # Locking
//
// File.mu serializes the commands of one File and guards its tables and the objects' dead flags.
// Lock order: File.mu, then Device.mu or the engine's lock; the doorbell watcher's lock is taken
// under File.mu too, and it calls the engine under its own. Commands call the engine with File.mu
// held. The engine calls a CQ's completion-event hook with its own lock held; the hook touches
// only the CQ's channel socket and atomic counters, never File.mu. The async-event forwarder
// delivers under File.mu alone, so a destroyed object never gets an event after its destroy
// reported the count.
package uverbs
