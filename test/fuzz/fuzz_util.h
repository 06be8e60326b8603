// fuzz_util.h: what the libFuzzer targets of test/fuzz/ share: the input as a file the parser opens by
// path, and the check that the committed seeds still parse (test/fuzz/README.md).
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// The parsers read files by path, so every input is written to one temporary file per process
// (rewritten in place each run: no file system churn), removed at exit.
static char fuzz_path_[4096];
static int fuzz_fd_ = -1;

static void fuzz_remove_temp_(void) {
    if (fuzz_fd_ >= 0) unlink(fuzz_path_);
}

// Writes data to the process's temporary file and returns its path (a name with no glob characters).
static const char* fuzz_temp_file(const uint8_t* data, size_t size, const char* name) {
    if (fuzz_fd_ < 0) {
        const char* dir = getenv("TMPDIR");
        snprintf(fuzz_path_, sizeof(fuzz_path_), "%s/fuzz_%s_XXXXXX.bin", dir && *dir ? dir : "/tmp", name);
        fuzz_fd_ = mkstemps(fuzz_path_, 4);
        if (fuzz_fd_ < 0) {
            perror("fuzz: cannot create a temporary file");
            abort();
        }
        atexit(fuzz_remove_temp_);
    }
    if (ftruncate(fuzz_fd_, 0) != 0 || (size > 0 && pwrite(fuzz_fd_, data, size, 0) != (ssize_t)size)) {
        perror("fuzz: cannot write the temporary file");
        abort();
    }
    return fuzz_path_;
}

// FUZZ_EXPECT_VALID=1 (make fuzz sets it when it runs the committed valid_* seeds alone): a parser
// that refuses its input is a failure, so a format change cannot silently leave the corpus invalid.
static void fuzz_expect_valid(int ok, const char* what, const char* why) {
    static int expect = -1;
    if (expect < 0) {
        const char* e = getenv("FUZZ_EXPECT_VALID");
        expect = e && *e && strcmp(e, "0") != 0;
    }
    if (expect && !ok) {
        fprintf(stderr, "fuzz: a valid seed was refused by %s: %s\n", what, why);
        abort();
    }
}

#endif  // FUZZ_UTIL_H
