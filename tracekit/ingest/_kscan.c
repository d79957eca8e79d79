/*
 * _kscan: a strict, single-pass scanner for the events of a Kineto/Chrome trace's
 * traceEvents array, producing fixed-width records instead of Python objects.
 *
 * scan(buf, pos) reads whole event objects from buf[pos:] (each followed by ',' or by
 * the array's closing ']') and returns
 *
 *     (status, offset, records, strings, trailing_comma)
 *
 *   status  0 MORE:        buf ends inside an event; offset = where that event starts
 *           1 CLOSED:      the array's ']' is at offset
 *           2 UNSUPPORTED: the event at offset is something this scanner does not take
 *                          (malformed JSON, invalid UTF-8, bare NaN/inf, a float beyond a
 *                          double, a float or bool pid/tid, a ts/dur that is not a number,
 *                          an escaped key or phase, ...); the caller reads from offset
 *                          with the general (msgspec) reader, which repairs or reports.
 *                          (Args ids that are not plain integers are not refused: the
 *                          record flags them, F_ODD, for the caller to decode.)
 *   records bytes of n fixed-width records (layout REC below, little-endian, native
 *           alignment; tracekit.ingest.kineto.REC_DTYPE mirrors it), one per event of any
 *           phase: REC.ph is PH_X, PH_M, PH_B, PH_E, PH_NONE (no "ph") or PH_OTHER
 *   strings list of str: the distinct strings the records' string codes index
 *           (cat, name, and pid/tid given as strings)
 *   trailing_comma  1 when ']' followed a ',' (an exporter defect the reader notes)
 *
 * Times: "ts"/"dur" are JSON numbers in microseconds. They become int64 nanoseconds
 * exactly, from their decimal text: mantissa digits x 10^(exponent - fraction digits + 3),
 * rounded half to even when digits fall below 1 ns (as Python's Decimal does). A value
 * beyond int64 ns, null or absent is marked not ok (the reader quarantines the event).
 *
 * The args keys read are the table ARG_KEYS (exported with the phase codes, PHASES); it is
 * tracekit.ingest.kineto.ARGS' "id" and "flag" rows, which a test checks.
 *
 * The GIL is released while scanning; the buffer is held through the buffer protocol.
 * Everything here is tracekit's own code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <stddef.h>

typedef struct {
    int64_t ts, dur, pid, tid, a_s, a_e, corr, ext_u, ext_l, dev, strm;
    int32_t cat, name;
    uint8_t ph, pid_k, tid_k, ts_ok, dur_ok, fl, pad0, pad1;
} REC;

/* fl bits: an args key present with an integer value ... */
#define F_CORR 1
#define F_EXTU 2
#define F_EXTL 4
#define F_DEV 8
#define F_STRM 16
#define F_ODD 32   /* one of those keys holds a non-null, non-integer value */
#define F_COLL 64  /* "Collective name" present and not null */
#define F_NELEM 128 /* "In msg nelems" present and not null */

/* phases (REC.ph): the ones the reader treats apart; any other phase is PH_OTHER */
#define PH_OTHER 0
#define PH_X 1
#define PH_M 2
#define PH_B 3
#define PH_E 4
#define PH_NONE 5 /* no "ph" key, or null */

/* id kinds */
#define K_INT 0
#define K_STR 1
#define K_NONE 2

enum { ST_MORE = 0, ST_CLOSED = 1, ST_UNSUP = 2 };
enum { RS_OK = 0, RS_NEED = 1, RS_BAD = 2 };

#define MAX_DEPTH 200

/* ---- string table -------------------------------------------------------------- */

typedef struct {
    uint64_t hash;
    int64_t off;   /* >= 0: offset in buf; < 0: -(offset+1) in arena */
    int64_t len;
    int32_t code;
} Slot;

typedef struct {
    const unsigned char *buf;
    int64_t n;
    /* records */
    REC *recs;
    int64_t nrec, caprec;
    /* strings */
    Slot *slots;
    int64_t nslots; /* power of two */
    int64_t nstr;
    int32_t *order; /* code -> slot index */
    int64_t caporder;
    unsigned char *arena;
    int64_t narena, caparena;
    int oom;
} Scan;

static uint64_t fnv(const unsigned char *p, int64_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static const unsigned char *slot_ptr(Scan *s, Slot *e) {
    return e->off >= 0 ? s->buf + e->off : s->arena + (-(e->off + 1));
}

/* Slots use len = -1 for empty; calloc gives 0, so mark them explicitly. */
static Slot *alloc_slots(int64_t nn) {
    Slot *ns = (Slot *)malloc((size_t)nn * sizeof(Slot));
    if (!ns) return NULL;
    for (int64_t i = 0; i < nn; i++) {
        ns[i].len = -1;
        ns[i].code = -1;
        ns[i].hash = 0;
        ns[i].off = 0;
    }
    return ns;
}

static int rehash(Scan *s) {
    int64_t nn = s->nslots * 2;
    Slot *ns = alloc_slots(nn);
    if (!ns) return -1;
    for (int64_t i = 0; i < s->nslots; i++) {
        Slot *e = &s->slots[i];
        if (e->len < 0) continue;
        int64_t j = (int64_t)(e->hash & (uint64_t)(nn - 1));
        while (ns[j].len >= 0) j = (j + 1) & (nn - 1);
        ns[j] = *e;
        s->order[e->code] = (int32_t)j;
    }
    free(s->slots);
    s->slots = ns;
    s->nslots = nn;
    return 0;
}

/* Intern bytes p[0:len] (off: their location code, see Slot.off); returns code or -1 (oom). */
static int32_t intern(Scan *s, const unsigned char *p, int64_t len, int64_t off) {
    uint64_t h = fnv(p, len);
    int64_t j = (int64_t)(h & (uint64_t)(s->nslots - 1));
    while (s->slots[j].len >= 0) {
        Slot *e = &s->slots[j];
        if (e->hash == h && e->len == len && memcmp(slot_ptr(s, e), p, (size_t)len) == 0) return e->code;
        j = (j + 1) & (s->nslots - 1);
    }
    if (s->nstr >= s->caporder) {
        int64_t nc = s->caporder * 2;
        int32_t *no = (int32_t *)realloc(s->order, (size_t)nc * sizeof(int32_t));
        if (!no) return -1;
        s->order = no;
        s->caporder = nc;
    }
    Slot *e = &s->slots[j];
    e->hash = h;
    e->len = len;
    e->off = off;
    e->code = (int32_t)s->nstr;
    s->order[s->nstr] = (int32_t)j;
    s->nstr++;
    if (s->nstr * 2 > s->nslots && rehash(s) < 0) return -1;
    return (int32_t)(s->nstr - 1);
}

static int arena_put(Scan *s, const unsigned char *p, int64_t n) {
    if (s->narena + n > s->caparena) {
        int64_t nc = s->caparena ? s->caparena * 2 : 4096;
        while (nc < s->narena + n) nc *= 2;
        unsigned char *na = (unsigned char *)realloc(s->arena, (size_t)nc);
        if (!na) return -1;
        s->arena = na;
        s->caparena = nc;
    }
    memcpy(s->arena + s->narena, p, (size_t)n);
    s->narena += n;
    return 0;
}

/* ---- lexing -------------------------------------------------------------------- */

static inline int64_t skip_ws(const unsigned char *b, int64_t i, int64_t n) {
    while (i < n && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t')) i++;
    return i;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Length of a valid UTF-8 sequence starting at b[i] (lead byte >= 0x80), 0 if invalid, -1 if cut. */
static int utf8_len(const unsigned char *b, int64_t i, int64_t n) {
    unsigned char c = b[i];
    int k;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { k = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { k = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { k = 4; cp = c & 0x07; }
    else return 0;
    if (i + k > n) return -1;
    for (int t = 1; t < k; t++) {
        unsigned char d = b[i + t];
        if ((d & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (d & 0x3F);
    }
    if (k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return k;
}

/* plain[c]: c can stand in a JSON string as itself, with no further check (printable ASCII
 * other than '"' and '\\'). Filled once at import. */
static unsigned char plain[256];

static void init_tables(void) {
    for (int c = 0; c < 256; c++) plain[c] = (c >= 0x20 && c < 0x80 && c != '"' && c != '\\');
}

/* A string starting at b[i] == '"'. Sets *end past the closing quote and *esc when it holds
 * escapes. RS_NEED if cut, RS_BAD if invalid (control char, bad escape, lone surrogate, bad UTF-8). */
static int lex_string(const unsigned char *b, int64_t i, int64_t n, int64_t *end, int *esc) {
    int64_t j = i + 1;
    *esc = 0;
    while (1) {
        /* fast run over plain ASCII */
        while (j + 4 <= n && plain[b[j]] && plain[b[j + 1]] && plain[b[j + 2]] && plain[b[j + 3]]) j += 4;
        while (j < n && plain[b[j]]) j++;
        if (j >= n) return RS_NEED;
        unsigned char c = b[j];
        if (c == '"') {
            *end = j + 1;
            return RS_OK;
        }
        if (c < 0x20) return RS_BAD;
        if (c == '\\') {
            *esc = 1;
            if (j + 1 >= n) return RS_NEED;
            unsigned char d = b[j + 1];
            if (d == 'u') {
                if (j + 6 > n) return RS_NEED;
                int v = 0;
                for (int t = 2; t < 6; t++) {
                    int hv = hexval(b[j + t]);
                    if (hv < 0) return RS_BAD;
                    v = v * 16 + hv;
                }
                if (v >= 0xDC00 && v <= 0xDFFF) return RS_BAD; /* lone low surrogate */
                if (v >= 0xD800 && v <= 0xDBFF) {
                    if (j + 6 >= n) return RS_NEED;
                    if (b[j + 6] != '\\') return RS_BAD;
                    if (j + 7 >= n) return RS_NEED;
                    if (b[j + 7] != 'u') return RS_BAD;
                    if (j + 12 > n) return RS_NEED;
                    int w = 0;
                    for (int t = 8; t < 12; t++) {
                        int hv = hexval(b[j + t]);
                        if (hv < 0) return RS_BAD;
                        w = w * 16 + hv;
                    }
                    if (w < 0xDC00 || w > 0xDFFF) return RS_BAD;
                    j += 12;
                } else {
                    j += 6;
                }
            } else if (d == '"' || d == '\\' || d == '/' || d == 'b' || d == 'f' || d == 'n' || d == 'r' || d == 't') {
                j += 2;
            } else {
                return RS_BAD;
            }
            continue;
        }
        int k = utf8_len(b, j, n);
        if (k < 0) return RS_NEED;
        if (k == 0) return RS_BAD;
        j += k;
    }
}

static void put_utf8(unsigned char *o, int64_t *m, uint32_t cp) {
    if (cp < 0x80) o[(*m)++] = (unsigned char)cp;
    else if (cp < 0x800) {
        o[(*m)++] = (unsigned char)(0xC0 | (cp >> 6));
        o[(*m)++] = (unsigned char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        o[(*m)++] = (unsigned char)(0xE0 | (cp >> 12));
        o[(*m)++] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*m)++] = (unsigned char)(0x80 | (cp & 0x3F));
    } else {
        o[(*m)++] = (unsigned char)(0xF0 | (cp >> 18));
        o[(*m)++] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        o[(*m)++] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*m)++] = (unsigned char)(0x80 | (cp & 0x3F));
    }
}

/* Intern the (already validated) string b[i:end] (quotes included); returns code, -1 on oom. */
static int32_t intern_string(Scan *s, int64_t i, int64_t end, int esc) {
    const unsigned char *b = s->buf;
    if (!esc) return intern(s, b + i + 1, end - i - 2, i + 1);
    /* unescape into a scratch area at the arena's end, then intern it there */
    int64_t start = s->narena;
    int64_t cap = end - i;
    if (arena_put(s, b + i, cap) < 0) return -1; /* reserve (unescaped is never longer) */
    unsigned char *o = s->arena + start;
    int64_t m = 0;
    for (int64_t j = i + 1; j < end - 1;) {
        unsigned char c = b[j];
        if (c != '\\') {
            o[m++] = c;
            j++;
            continue;
        }
        unsigned char d = b[j + 1];
        if (d == 'u') {
            uint32_t v = 0;
            for (int t = 2; t < 6; t++) v = v * 16 + (uint32_t)hexval(b[j + t]);
            j += 6;
            if (v >= 0xD800 && v <= 0xDBFF) {
                uint32_t w = 0;
                for (int t = 2; t < 6; t++) w = w * 16 + (uint32_t)hexval(b[j + t]);
                j += 6;
                v = 0x10000 + ((v - 0xD800) << 10) + (w - 0xDC00);
            }
            put_utf8(o, &m, v);
        } else {
            unsigned char r = d == 'b' ? '\b' : d == 'f' ? '\f' : d == 'n' ? '\n' : d == 'r' ? '\r' : d == 't' ? '\t' : d;
            o[m++] = r;
            j += 2;
        }
    }
    int32_t code = intern(s, o, m, -(start + 1));
    if (code >= 0 && s->nstr - 1 == code && s->slots[s->order[code]].off == -(start + 1)) {
        s->narena = start + m; /* keep the new string */
    } else {
        s->narena = start; /* already known: drop the scratch copy */
    }
    return code;
}

/* Number grammar; *end past it. Fills mantissa/scale when it fits (else *big = 1). */
typedef struct {
    int neg, is_int, big;
    uint64_t mant;
    int64_t exp10; /* value = mant * 10^exp10 */
} Num;

static int lex_number(const unsigned char *b, int64_t i, int64_t n, int64_t *end, Num *x) {
    int64_t j = i;
    int64_t nint = 0, nlz = 0, eval = 0; /* integer digits, fraction zeros before a nonzero, exponent */
    int nz = 0;                          /* a nonzero digit seen */
    x->neg = 0;
    x->is_int = 1;
    x->big = 0;
    x->mant = 0;
    x->exp10 = 0;
    if (j < n && b[j] == '-') { x->neg = 1; j++; }
    if (j >= n) return RS_NEED;
    if (b[j] == '0') {
        j++;
    } else if (b[j] >= '1' && b[j] <= '9') {
        nz = 1;
        while (j < n && b[j] >= '0' && b[j] <= '9') {
            if (x->mant > (UINT64_MAX - 9) / 10) x->big = 1;
            else x->mant = x->mant * 10 + (uint64_t)(b[j] - '0');
            nint++;
            j++;
        }
    } else {
        return RS_BAD;
    }
    if (j < n && b[j] == '.') {
        x->is_int = 0;
        j++;
        if (j >= n) return RS_NEED;
        if (!(b[j] >= '0' && b[j] <= '9')) return RS_BAD;
        while (j < n && b[j] >= '0' && b[j] <= '9') {
            if (!nz) {
                if (b[j] == '0') nlz++;
                else nz = 1;
            }
            if (x->mant > (UINT64_MAX - 9) / 10) x->big = 1;
            else { x->mant = x->mant * 10 + (uint64_t)(b[j] - '0'); x->exp10--; }
            j++;
        }
    }
    if (j < n && (b[j] == 'e' || b[j] == 'E')) {
        x->is_int = 0;
        j++;
        int eneg = 0;
        if (j < n && (b[j] == '+' || b[j] == '-')) { eneg = b[j] == '-'; j++; }
        if (j >= n) return RS_NEED;
        if (!(b[j] >= '0' && b[j] <= '9')) return RS_BAD;
        int64_t e = 0;
        while (j < n && b[j] >= '0' && b[j] <= '9') {
            if (e < 100000) e = e * 10 + (b[j] - '0');
            j++;
        }
        eval = eneg ? -e : e;
        x->exp10 += eval;
    }
    if (j >= n) return RS_NEED; /* a number may go on in the next block */
    if (!x->is_int && nz) {
        /* a float beyond a double's range (about 1.8e308) is an error to the general reader:
         * leave it to that reader, so that both paths take and refuse the same files */
        int64_t mag = (nint > 0 ? nint - 1 : -(nlz + 1)) + eval;
        if (mag >= 308) return RS_BAD;
    }
    *end = j;
    return RS_OK;
}

/* µs number → ns. Returns 1 ok, 0 out of int64 range, -1 not representable here (big mantissa). */
static int num_to_ns(const Num *x, int64_t *out) {
    if (x->big) return -1;
    int64_t sc = x->exp10 + 3;
    unsigned __int128 v = x->mant;
    if (v == 0) { *out = 0; return 1; }
    if (sc >= 0) {
        if (sc > 19) return 0;
        for (int64_t k = 0; k < sc; k++) {
            v *= 10;
            if (v > (unsigned __int128)INT64_MAX) return 0;
        }
    } else {
        if (-sc > 19) { *out = 0; return 1; } /* below 1e-19 ns of precision: rounds to 0 */
        unsigned __int128 p = 1;
        for (int64_t k = 0; k < -sc; k++) p *= 10;
        unsigned __int128 q = v / p, r = v % p;
        unsigned __int128 twice = r * 2;
        if (twice > p || (twice == p && (q & 1))) q += 1;
        v = q;
    }
    if (v > (unsigned __int128)INT64_MAX) return 0;
    *out = x->neg ? -(int64_t)v : (int64_t)v;
    return 1;
}

static int skip_value(Scan *s, int64_t i, int64_t *end, int depth);

static int skip_container(Scan *s, int64_t i, int64_t *end, int depth) {
    const unsigned char *b = s->buf;
    int64_t n = s->n;
    unsigned char open = b[i], close = open == '{' ? '}' : ']';
    if (depth > MAX_DEPTH) return RS_BAD;
    int64_t j = skip_ws(b, i + 1, n);
    if (j >= n) return RS_NEED;
    if (b[j] == close) { *end = j + 1; return RS_OK; }
    while (1) {
        int r;
        if (open == '{') {
            if (b[j] != '"') return RS_BAD;
            int esc;
            r = lex_string(b, j, n, &j, &esc);
            if (r) return r;
            j = skip_ws(b, j, n);
            if (j >= n) return RS_NEED;
            if (b[j] != ':') return RS_BAD;
            j = skip_ws(b, j + 1, n);
            if (j >= n) return RS_NEED;
        }
        r = skip_value(s, j, &j, depth + 1);
        if (r) return r;
        j = skip_ws(b, j, n);
        if (j >= n) return RS_NEED;
        if (b[j] == ',') {
            j = skip_ws(b, j + 1, n);
            if (j >= n) return RS_NEED;
            continue;
        }
        if (b[j] == close) { *end = j + 1; return RS_OK; }
        return RS_BAD;
    }
}

static int lex_literal(const unsigned char *b, int64_t i, int64_t n, int64_t *end, const char *lit) {
    int64_t k = (int64_t)strlen(lit);
    for (int64_t t = 0; t < k; t++) {
        if (i + t >= n) return RS_NEED;
        if (b[i + t] != (unsigned char)lit[t]) return RS_BAD;
    }
    *end = i + k;
    return RS_OK;
}

static int skip_value(Scan *s, int64_t i, int64_t *end, int depth) {
    const unsigned char *b = s->buf;
    int64_t n = s->n;
    if (i >= n) return RS_NEED;
    unsigned char c = b[i];
    if (c == '"') {
        int esc;
        return lex_string(b, i, n, end, &esc);
    }
    if (c == '{' || c == '[') return skip_container(s, i, end, depth);
    if (c == '-' || (c >= '0' && c <= '9')) {
        Num x;
        return lex_number(b, i, n, end, &x);
    }
    if (c == 't') return lex_literal(b, i, n, end, "true");
    if (c == 'f') return lex_literal(b, i, n, end, "false");
    if (c == 'n') return lex_literal(b, i, n, end, "null");
    return RS_BAD;
}

/* ---- events -------------------------------------------------------------------- */

/* Object members. At b[*j], a member's key: lex "key" ':' and set k and kl (the raw key
 * bytes, quotes excluded), esc (the key has escapes) and j (the value's first byte). */
static int member_key(Scan *s, int64_t *j, const unsigned char **k, int64_t *kl, int *esc) {
    const unsigned char *b = s->buf;
    int64_t n = s->n;
    if (b[*j] != '"') return RS_BAD;
    int64_t ks = *j + 1;
    int r = lex_string(b, *j, n, j, esc);
    if (r) return r;
    *k = b + ks;
    *kl = (*j - 1) - ks;
    *j = skip_ws(b, *j, n);
    if (*j >= n) return RS_NEED;
    if (b[*j] != ':') return RS_BAD;
    *j = skip_ws(b, *j + 1, n);
    if (*j >= n) return RS_NEED;
    return RS_OK;
}

#define RS_CLOSED 3

/* After a member's value at b[*j]: RS_OK with *j at the next member after ',', RS_CLOSED with
 * *end past the object's '}', or RS_NEED / RS_BAD. */
static int member_next(Scan *s, int64_t *j, int64_t *end) {
    const unsigned char *b = s->buf;
    int64_t n = s->n;
    *j = skip_ws(b, *j, n);
    if (*j >= n) return RS_NEED;
    if (b[*j] == ',') {
        *j = skip_ws(b, *j + 1, n);
        return *j >= n ? RS_NEED : RS_OK;
    }
    if (b[*j] == '}') {
        *end = *j + 1;
        return RS_CLOSED;
    }
    return RS_BAD;
}

#define KEYIS(p, len, lit) ((len) == (int64_t)sizeof(lit) - 1 && memcmp((p), (lit), sizeof(lit) - 1) == 0)

/* An integer-valued args field: sets *v and bit on a plain int64, F_ODD on another non-null value. */
static int arg_int(Scan *s, int64_t j, int64_t *end, int64_t *v, uint8_t *fl, uint8_t bit) {
    const unsigned char *b = s->buf;
    unsigned char c = b[j];
    if (c == '-' || (c >= '0' && c <= '9')) {
        Num x;
        int r = lex_number(b, j, s->n, end, &x);
        if (r) return r;
        if (x.is_int && !x.big && x.mant <= (uint64_t)INT64_MAX) {
            *v = x.neg ? -(int64_t)x.mant : (int64_t)x.mant;
            *fl |= bit;
        } else {
            *fl = (uint8_t)((*fl & ~bit) | F_ODD);
        }
        return RS_OK;
    }
    if (c == 'n') {
        *fl &= (uint8_t)~bit;
        return lex_literal(b, j, s->n, end, "null");
    }
    int r = skip_value(s, j, end, 2);
    if (r) return r;
    *fl = (uint8_t)((*fl & ~bit) | F_ODD);
    return RS_OK;
}

/* The args keys the scanner reads: where a plain integer value goes (an offset in REC) or -1 for
 * a key whose presence (non-null) is a flag bit. tracekit.ingest.kineto.ARGS is the table these
 * come from; the module exports this one as ARG_KEYS ((key, REC field, offset, bit), ...) and a
 * test checks that the two agree. */
typedef struct { const char *key; int64_t len; const char *field; Py_ssize_t off; uint8_t bit; } ArgKey;
#define ARG_INT(key, fld, bit) {key, (int64_t)sizeof(key) - 1, #fld, (Py_ssize_t)offsetof(REC, fld), bit}
#define ARG_FLAG(key, bit) {key, (int64_t)sizeof(key) - 1, NULL, -1, bit}
static const ArgKey ARG_KEYS[] = {
    ARG_INT("correlation", corr, F_CORR),
    ARG_INT("External id", ext_u, F_EXTU),
    ARG_INT("external id", ext_l, F_EXTL),
    ARG_INT("device", dev, F_DEV),
    ARG_INT("stream", strm, F_STRM),
    ARG_FLAG("Collective name", F_COLL),
    ARG_FLAG("In msg nelems", F_NELEM),
};
#define N_ARG_KEYS ((int)(sizeof(ARG_KEYS) / sizeof(ARG_KEYS[0])))

static const ArgKey *find_arg(const unsigned char *k, int64_t kl) {
    for (int t = 0; t < N_ARG_KEYS; t++)
        if (ARG_KEYS[t].len == kl && memcmp(ARG_KEYS[t].key, k, (size_t)kl) == 0) return &ARG_KEYS[t];
    return NULL;
}

static int parse_args(Scan *s, int64_t i, int64_t *end, REC *e) {
    const unsigned char *b = s->buf;
    int64_t n = s->n;
    e->a_s = i;
    e->fl = 0;
    if (b[i] != '{') {
        int r = skip_value(s, i, end, 1);
        if (r) return r;
        e->a_e = *end;
        return RS_OK;
    }
    int64_t j = skip_ws(b, i + 1, n);
    if (j >= n) return RS_NEED;
    if (b[j] == '}') { *end = j + 1; e->a_e = *end; return RS_OK; }
    while (1) {
        const unsigned char *k;
        int64_t kl;
        int esc;
        int r = member_key(s, &j, &k, &kl, &esc);
        if (r) return r;
        if (esc) return RS_BAD; /* an escaped key might spell one of ours: leave it to the general reader */
        const ArgKey *a = find_arg(k, kl);
        if (a && a->off >= 0) {
            r = arg_int(s, j, &j, (int64_t *)((char *)e + a->off), &e->fl, a->bit);
        } else if (a) { /* a presence flag: set unless the value is null */
            if (b[j] == 'n') {
                r = lex_literal(b, j, n, &j, "null");
                e->fl &= (uint8_t)~a->bit;
            } else {
                r = skip_value(s, j, &j, 2);
                e->fl |= a->bit;
            }
        } else {
            r = skip_value(s, j, &j, 2);
        }
        if (r) return r;
        r = member_next(s, &j, end);
        if (r == RS_CLOSED) {
            e->a_e = *end;
            return RS_OK;
        }
        if (r) return r;
    }
}

/* A string-valued field (cat, name): code, -1 for null; RS_BAD for another type. */
static int str_field(Scan *s, int64_t j, int64_t *end, int32_t *code) {
    const unsigned char *b = s->buf;
    if (b[j] == '"') {
        int esc;
        int r = lex_string(b, j, s->n, end, &esc);
        if (r) return r;
        int32_t c = intern_string(s, j, *end, esc);
        if (c < 0) { s->oom = 1; return RS_BAD; }
        *code = c;
        return RS_OK;
    }
    if (b[j] == 'n') {
        *code = -1;
        return lex_literal(b, j, s->n, end, "null");
    }
    return RS_BAD;
}

/* pid/tid: an int64, a string (code), or null. */
static int id_field(Scan *s, int64_t j, int64_t *end, int64_t *v, uint8_t *kind) {
    const unsigned char *b = s->buf;
    unsigned char c = b[j];
    if (c == '"') {
        int32_t code;
        int r = str_field(s, j, end, &code);
        if (r) return r;
        *v = code;
        *kind = K_STR;
        return RS_OK;
    }
    if (c == 'n') {
        *kind = K_NONE;
        *v = 0;
        return lex_literal(b, j, s->n, end, "null");
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        Num x;
        int r = lex_number(b, j, s->n, end, &x);
        if (r) return r;
        if (!x.is_int || x.big || x.mant > (uint64_t)INT64_MAX) return RS_BAD;
        *v = x.neg ? -(int64_t)x.mant : (int64_t)x.mant;
        *kind = K_INT;
        return RS_OK;
    }
    return RS_BAD;
}

/* ts/dur: a JSON number → exact ns (ok), null → not ok; another type → RS_BAD. */
static int time_field(Scan *s, int64_t j, int64_t *end, int64_t *v, uint8_t *ok) {
    const unsigned char *b = s->buf;
    unsigned char c = b[j];
    if (c == 'n') {
        *ok = 0;
        *v = 0;
        return lex_literal(b, j, s->n, end, "null");
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        Num x;
        int r = lex_number(b, j, s->n, end, &x);
        if (r) return r;
        int q = num_to_ns(&x, v);
        if (q < 0) return RS_BAD;
        /* an integer µs of 2^63/1000 or more is out of range, as in the msgspec path */
        if (x.is_int && x.mant >= 9223372036854775ULL) q = 0;
        *ok = (uint8_t)q;
        if (!q) *v = 0;
        return RS_OK;
    }
    return RS_BAD;
}

static int parse_event(Scan *s, int64_t i, int64_t *end, REC *e) {
    const unsigned char *b = s->buf;
    int64_t n = s->n;
    memset(e, 0, sizeof(REC));
    e->cat = -1;
    e->name = -1;
    e->pid_k = K_NONE;
    e->tid_k = K_NONE;
    e->a_s = -1;
    e->a_e = -1;
    e->ph = PH_NONE;
    int64_t j = skip_ws(b, i + 1, n);
    if (j >= n) return RS_NEED;
    if (b[j] == '}') { *end = j + 1; return RS_OK; }
    while (1) {
        const unsigned char *k;
        int64_t kl;
        int esc;
        int r = member_key(s, &j, &k, &kl, &esc);
        if (r) return r;
        if (esc) return RS_BAD;
        if (KEYIS(k, kl, "ph")) {
            if (b[j] == '"') {
                int64_t se;
                int es2;
                r = lex_string(b, j, n, &se, &es2);
                if (!r && es2) r = RS_BAD; /* "\u0058" is "X" too: leave escaped phases to msgspec */
                if (!r) {
                    unsigned char c = se - j == 3 ? b[j + 1] : 0;
                    if (c == 'b' || c == 'e') r = RS_BAD; /* async spans: paired by id, in the msgspec path */
                    e->ph = c == 'X' ? PH_X : c == 'M' ? PH_M : c == 'B' ? PH_B : c == 'E' ? PH_E : PH_OTHER;
                    j = se;
                }
            } else if (b[j] == 'n') {
                e->ph = PH_NONE;
                r = lex_literal(b, j, n, &j, "null");
            } else {
                e->ph = PH_OTHER;
                r = skip_value(s, j, &j, 1);
            }
        } else if (KEYIS(k, kl, "cat")) {
            r = str_field(s, j, &j, &e->cat);
        } else if (KEYIS(k, kl, "name")) {
            r = str_field(s, j, &j, &e->name);
        } else if (KEYIS(k, kl, "pid")) {
            r = id_field(s, j, &j, &e->pid, &e->pid_k);
        } else if (KEYIS(k, kl, "tid")) {
            r = id_field(s, j, &j, &e->tid, &e->tid_k);
        } else if (KEYIS(k, kl, "ts")) {
            r = time_field(s, j, &j, &e->ts, &e->ts_ok);
        } else if (KEYIS(k, kl, "dur")) {
            r = time_field(s, j, &j, &e->dur, &e->dur_ok);
        } else if (KEYIS(k, kl, "args")) {
            r = parse_args(s, j, &j, e);
        } else {
            r = skip_value(s, j, &j, 1);
        }
        if (r) return r;
        r = member_next(s, &j, end);
        if (r == RS_CLOSED) return RS_OK;
        if (r) return r;
    }
}

static int push_rec(Scan *s, const REC *e) {
    if (s->nrec >= s->caprec) {
        int64_t nc = s->caprec ? s->caprec * 2 : 4096;
        REC *nr = (REC *)realloc(s->recs, (size_t)nc * sizeof(REC));
        if (!nr) return -1;
        s->recs = nr;
        s->caprec = nc;
    }
    s->recs[s->nrec++] = *e;
    return 0;
}

/* The scan proper (no Python calls). */
static int run_scan(Scan *s, int64_t pos, int64_t *offset, int *trailing_comma) {
    const unsigned char *b = s->buf;
    int64_t n = s->n;
    int64_t i = skip_ws(b, pos, n);
    int after_comma = 0;
    *trailing_comma = 0;
    while (1) {
        if (i >= n) { *offset = i; return ST_MORE; }
        if (b[i] == ']') {
            *trailing_comma = after_comma;
            *offset = i;
            return ST_CLOSED;
        }
        if (b[i] != '{') { *offset = i; return ST_UNSUP; }
        REC e;
        int64_t end = i;
        int r = parse_event(s, i, &end, &e);
        if (r == RS_NEED) { *offset = i; return ST_MORE; }
        if (r == RS_BAD || s->oom) { *offset = i; return ST_UNSUP; }
        int64_t j = skip_ws(b, end, n);
        if (j >= n) { *offset = i; return ST_MORE; } /* separator not seen yet */
        if (b[j] == ',') {
            if (push_rec(s, &e) < 0) { s->oom = 1; *offset = i; return ST_UNSUP; }
            after_comma = 1;
            i = skip_ws(b, j + 1, n);
            continue;
        }
        if (b[j] == ']') {
            if (push_rec(s, &e) < 0) { s->oom = 1; *offset = i; return ST_UNSUP; }
            *offset = j;
            return ST_CLOSED;
        }
        *offset = i;
        return ST_UNSUP;
    }
}

static void scan_free(Scan *s) {
    free(s->recs);
    free(s->slots);
    free(s->order);
    free(s->arena);
}

static PyObject *py_scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "y*n", &view, &pos)) return NULL;
    if (pos < 0 || pos > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "pos out of range");
        return NULL;
    }
    Scan s;
    memset(&s, 0, sizeof(s));
    s.buf = (const unsigned char *)view.buf;
    s.n = view.len;
    s.nslots = 4096;
    s.slots = alloc_slots(s.nslots);
    s.caporder = 1024;
    s.order = (int32_t *)malloc((size_t)s.caporder * sizeof(int32_t));
    if (!s.slots || !s.order) {
        scan_free(&s);
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    int64_t offset = 0;
    int tc = 0, st;
    Py_BEGIN_ALLOW_THREADS
    st = run_scan(&s, pos, &offset, &tc);
    Py_END_ALLOW_THREADS
    if (s.oom) {
        scan_free(&s);
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    PyObject *strings = PyList_New((Py_ssize_t)s.nstr);
    PyObject *recs = NULL;
    if (!strings) goto fail;
    for (int64_t c = 0; c < s.nstr; c++) {
        Slot *e = &s.slots[s.order[c]];
        PyObject *u = PyUnicode_DecodeUTF8((const char *)slot_ptr(&s, e), (Py_ssize_t)e->len, "strict");
        if (!u) goto fail; /* validated above, so only on memory errors */
        PyList_SET_ITEM(strings, (Py_ssize_t)c, u);
    }
    recs = PyBytes_FromStringAndSize((const char *)s.recs, (Py_ssize_t)(s.nrec * (int64_t)sizeof(REC)));
    if (!recs) goto fail;
    scan_free(&s);
    PyBuffer_Release(&view);
    return Py_BuildValue("(iLNNi)", st, (long long)offset, recs, strings, tc);
fail:
    Py_XDECREF(strings);
    Py_XDECREF(recs);
    scan_free(&s);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"scan", py_scan, METH_VARARGS,
     "scan(buf, pos) -> (status, offset, records, strings, trailing_comma); see the module source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_kscan", "Kineto traceEvents scanner (tracekit).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kscan(void) {
    init_tables();
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "RECORD_SIZE", (long)sizeof(REC)) < 0) return NULL;
    PyObject *keys = PyTuple_New(N_ARG_KEYS);
    if (!keys) return NULL;
    for (int t = 0; t < N_ARG_KEYS; t++) {
        const ArgKey *a = &ARG_KEYS[t];
        PyObject *item = a->field ? Py_BuildValue("(ssni)", a->key, a->field, a->off, (int)a->bit)
                                  : Py_BuildValue("(sOni)", a->key, Py_None, a->off, (int)a->bit);
        if (!item) { Py_DECREF(keys); return NULL; }
        PyTuple_SET_ITEM(keys, t, item);
    }
    if (PyModule_AddObject(m, "ARG_KEYS", keys) < 0) { Py_DECREF(keys); return NULL; }
    PyObject *ph = Py_BuildValue("{sisisisisisi}", "other", PH_OTHER, "X", PH_X, "M", PH_M, "B", PH_B, "E", PH_E,
                                 "none", PH_NONE);
    if (!ph || PyModule_AddObject(m, "PHASES", ph) < 0) { Py_XDECREF(ph); return NULL; }
    return m;
}
