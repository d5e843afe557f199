// Package compress is an optional step before a provider call that makes
// the user content of a request shorter: diagnosis prompts carry ECU logs
// and tool results in which the same line ("U0100 lost communication with
// ECM") is often repeated hundreds of times, padded with alignment blanks.
//
// # What is compressed
//
// Only the text blocks and tool_result blocks of user messages. The system
// prompt, assistant messages (their text and tool_use inputs), tools and
// every other field of the request are passed on unchanged. Each text is
// cut into lines at "\n" and three conservative rules apply, in order:
//
//  1. White space. In each line, every inner run of two or more spaces or
//     tabs becomes one space, and trailing spaces, tabs and carriage
//     returns go; leading indentation is kept (it carries the structure of
//     JSON, YAML and stack traces), a single tab stays a tab and other
//     white space (form feed, Unicode spaces) is not touched. Three or more
//     blank lines in a row become one blank line. If squeezing a line
//     would change what a protected pattern matches in it ("ECU  BMS"
//     would turn into the ECU id "ECU BMS"), only its trailing blanks go,
//     or nothing.
//
//  2. Repeated lines. MinRepeat (default 3) or more equal consecutive
//     lines (after rule 1) become the first of them and the marker
//
//     [previous line repeated N more times]
//
//     where N is the number of lines dropped ("1 more time" for one).
//
//  3. Repeated lines with timestamps (Config.KeepTimestamps turns it off).
//     MinRepeat or more consecutive lines that are equal but for a leading
//     timestamp become the first of them, with its timestamp, and
//
//     [previous line repeated N more times, last at TIMESTAMP]
//
//     with the last line's timestamp. A leading timestamp is an ISO 8601
//     date-time (2024-11-03T08:15:22.123Z, 2024-11-03 08:15:22,123+01:00),
//     a syslog time (Nov  3 08:15:22), a Unix time of 2001-2033 in seconds
//     or milliseconds with an optional fraction (1730621722.123456, as
//     candump -l writes), or a clock time (08:15:22.123), optionally in []
//     or (), at the very start of the line and followed by a blank. The
//     lines of a run must have timestamps of the same shape (same length,
//     digits in the same places, same other characters) that never go
//     backwards; anything else (a retry counter, a different DTC, a bare
//     relative time such as Vector ASC's 1.234567, which reads as a
//     version) makes the lines different. Timestamps are not protected
//     entities, as for the cache's guard (cache.IgnoredPatternsDefault);
//     the ones in the middle of a run are the only thing dropped that rule
//     2 would keep.
//
// A run is only collapsed when the marker is shorter than the lines it
// replaces, so a text never grows. Blank lines and lines that read as a
// marker (also markers that were in the input; blank widths do not count)
// never join a run, so a marker always refers to the content line above
// it, and compression is idempotent: compressing a compressed text again
// changes nothing.
//
// # What is never touched
//
// Protected entities: the matches of Config.ProtectedPatterns, by default
// cache.ProtectedPatternsDefault(), the semantic cache's definition (DTCs
// such as P0A80 and U0100, ECU ids such as ECU-7E0 and ECU BMS, part
// numbers, versions such as 2.4.1 and v10.3, any other number). Rule 1
// keeps every line's matches (same text, same order); rules 2 and 3 only
// merge lines whose text outside a leading timestamp is byte for byte
// equal, so two lines that differ in a DTC, an ECU id or a version are
// never merged, and any line whose entities differ from the line before
// breaks a run. Expanding each marker back into N copies of the line
// above it gives the same sequence of protected matches per pattern as
// the input (FuzzProtectedEntitiesSurvive checks it for any input).
//
// # Why it is off by default
//
// Compression changes the prompt the model sees, and answers may differ
// from those to the uncompressed prompt: the model no longer sees the
// exact log, the intermediate retry timestamps or the column alignment.
// It is an operator's choice per deployment, with a per-request opt-out
// for callers that need the log verbatim (a nil *Compressor, or simply not
// calling Request).
//
// The caller should compute cache keys (cache.KeyOf, the tool-results
// hash, coalescing refs) on the uncompressed request and compress only the
// copy that goes to the provider: that way turning compression on or off,
// or changing its rules, does not change which requests share a cached
// answer, and the cache's protected-entity guard sees the full text.
//
// # Cost
//
// The protected patterns are compiled once by New. Rule 1 only runs the
// patterns that could see a difference (those that can match a blank or
// hold an anchor: of the defaults, only the ECU id pattern) and only on
// lines it changes; rule 3 runs the same patterns on lines with a
// timestamp, which is parsed by hand. On testdata/ecu_can_uds.log (a
// 246-line, 16.5 kB CAN/UDS log with 200 retries of U0100) Request saves
// 3,269 of 4,171 estimated input tokens (78 %) in 0.24-0.35 ms on one
// core of a shared 2-core machine (BenchmarkRequest: 47-69 MB/s, 74 kB
// and 381 allocations per request).
package compress
