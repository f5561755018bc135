/* sockherd.ipc._depth: how deep a msgpack payload nests, in one pass in C.
 *
 * ipc/nesting.py says why the ipc layer bounds nesting itself before
 * msgspec decodes anything. The walk was pure Python (0.1 to 0.25 us per
 * byte: 2-4 s for a 16 MB frame built to be slow); here it is the same walk,
 * a few ns per item, with the GIL released while it runs.
 *
 * The walk keeps, for each open container, how many items it still has to
 * read (an explicit stack: no recursion), and stops at the first container
 * opened deeper than the limit. It measures nesting and nothing else: a
 * truncated payload or a reserved byte ends it, and the decoder, whose words
 * for those are better, reports them.
 *
 * The same walk also finds the first str item whose bytes are not UTF-8
 * (scan, which reports both in one pass): msgspec's words for that changed between releases
 * (a UnicodeDecodeError up to 0.22, "Invalid UTF-8 encoded string" in
 * 0.23), so the ipc layer checks it itself and says it in its own words.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MAX_LIMIT 1024          /* far above any bound the ipc layer sets */

/* Per first byte of an item (the msgpack spec's format table, as data):
 * its whole size when fixed; else the size of the big-endian length or
 * count after it, the ext type byte after that, and for containers how
 * many items each count stands for (1 per array element, 2 per map entry).
 * 0xc1 is reserved: all zero, the walk stops there. */
static uint8_t fixed[256], lenbytes[256], extra[256], items[256];

static void init_tables(void)
{
    static const uint8_t ints[][2] = {
        {0xcc, 2}, {0xd0, 2}, {0xcd, 3}, {0xd1, 3}, {0xca, 5}, {0xce, 5}, {0xd2, 5},
        {0xcb, 9}, {0xcf, 9}, {0xd3, 9},                          /* ints and floats */
        {0xd4, 3}, {0xd5, 4}, {0xd6, 6}, {0xd7, 10}, {0xd8, 18}}; /* fixext */
    static const uint8_t lens[][2] = {
        {0xc4, 1}, {0xc5, 2}, {0xc6, 4}, {0xd9, 1}, {0xda, 2}, {0xdb, 4}}; /* bin, str */
    static const uint8_t conts[][3] = {
        {0xdc, 2, 1}, {0xdd, 4, 1}, {0xde, 2, 2}, {0xdf, 4, 2}}; /* array, map 16/32 */
    for (int b = 0; b < 256; b++) {
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
            fixed[b] = 1;                           /* fixint, nil, false, true */
        else if (b <= 0x8f)
            items[b] = 2;                           /* fixmap */
        else if (b <= 0x9f)
            items[b] = 1;                           /* fixarray */
        else if (b <= 0xbf)
            fixed[b] = 1 + (b & 0x1f);              /* fixstr */
    }
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        fixed[ints[i][0]] = ints[i][1];
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++)
        lenbytes[lens[i][0]] = lens[i][1];
    for (int b = 0xc7; b <= 0xc9; b++) {            /* ext 8/16/32 */
        lenbytes[b] = (uint8_t)(1 << (b - 0xc7));
        extra[b] = 1;
    }
    for (size_t i = 0; i < sizeof conts / sizeof *conts; i++) {
        lenbytes[conts[i][0]] = conts[i][1];
        items[conts[i][0]] = conts[i][2];
    }
}

/* 1 if p[0..n) is UTF-8 as RFC 3629 and Python's strict codec define it:
 * no overlong forms, no surrogates (U+D800-DFFF), nothing past U+10FFFF. */
static int utf8_valid(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint8_t lo = 0x80, hi = 0xbf;   /* the second byte's range */
        if (c >= 0xc2 && c <= 0xdf)
            len = 2;
        else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            if (c == 0xe0)
                lo = 0xa0;              /* overlong */
            else if (c == 0xed)
                hi = 0x9f;              /* surrogates */
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            if (c == 0xf0)
                lo = 0x90;              /* overlong */
            else if (c == 0xf4)
                hi = 0x8f;              /* past U+10FFFF */
        } else
            return 0;
        if (n - i < len || p[i + 1] < lo || p[i + 1] > hi)
            return 0;
        for (size_t k = 2; k < len; k++)
            if ((p[i + k] & 0xc0) != 0x80)
                return 0;
        i += len;
    }
    return 1;
}

/* The walk. Returns the offset of the first container header deeper than
 * limit levels (the outermost container is level 1), or -1 if there is
 * none before the walk ends. If bad is not NULL, bad[0] and bad[1] are set
 * to the offset and length of the first str item's bytes that are not
 * UTF-8, met before the walk ends (-1 and 0 if none). */
static Py_ssize_t walk(const uint8_t *p, size_t end, size_t limit, Py_ssize_t *bad)
{
    uint64_t outer[MAX_LIMIT];  /* items still to read in each enclosing container */
    size_t depth = 0;
    uint64_t remaining = 1;     /* items still to read at this level; 0: the payload */
    size_t pos = 0;

    for (;;) {
        if (!remaining) {
            if (!depth)
                return -1;
            remaining = outer[--depth];
            continue;
        }
        if (pos >= end)
            return -1;                      /* truncated: the decoder says so */
        remaining--;
        uint8_t first = p[pos];
        if (fixed[first]) {
            if (bad && first >= 0xa0 && first <= 0xbf && bad[0] < 0 && pos + fixed[first] <= end
                && !utf8_valid(p + pos + 1, fixed[first] - 1u)) {
                bad[0] = (Py_ssize_t)pos + 1;               /* a fixstr */
                bad[1] = fixed[first] - 1;
            }
            pos += fixed[first];
            continue;
        }
        size_t size = lenbytes[first];
        uint64_t count = 0;
        if (size) {
            if (end - pos - 1 < size)
                return -1;                  /* truncated header */
            for (size_t i = 0; i < size; i++)
                count = count << 8 | p[pos + 1 + i];
        } else if (items[first]) {
            count = first & 0x0f;
        } else {
            return -1;                      /* reserved byte: the decoder says so */
        }
        if (!items[first]) {
            /* a str, bin or ext: skipped whole; past the end is truncation */
            uint64_t skip = 1 + size + extra[first] + count;
            if (skip > end - pos)
                return -1;
            if (bad && first >= 0xd9 && first <= 0xdb && bad[0] < 0
                && !utf8_valid(p + pos + 1 + size, (size_t)count)) {
                bad[0] = (Py_ssize_t)(pos + 1 + size);      /* a str 8/16/32 */
                bad[1] = (Py_ssize_t)count;
            }
            pos += (size_t)skip;
            continue;
        }
        if (depth >= limit)                 /* this container is level depth + 1 */
            return (Py_ssize_t)pos;
        pos += 1 + size;
        if (count) {                        /* an empty one opens and closes at once */
            outer[depth++] = remaining;
            remaining = count * items[first];
        }
    }
}

static PyObject *first_too_deep(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t limit, found;
    PyObject *result = NULL;

    (void)self;
    if (!PyArg_ParseTuple(args, "y*n:first_too_deep", &view, &limit))
        return NULL;
    if (limit < 0 || limit > MAX_LIMIT) {
        PyErr_Format(PyExc_ValueError, "limit %zd: 0 to %d", limit, MAX_LIMIT);
        goto done;
    }
    /* the buffer is exported to us until released: nothing resizes it */
    Py_BEGIN_ALLOW_THREADS
    found = walk(view.buf, (size_t)view.len, (size_t)limit, NULL);
    Py_END_ALLOW_THREADS
    result = found < 0 ? Py_NewRef(Py_None) : PyLong_FromSsize_t(found);
done:
    PyBuffer_Release(&view);
    return result;
}

/* scan(payload, limit) -> (first_too_deep, first_bad_string): both of the
 * walk's findings in one pass, for messages.decode. The bad string is the
 * first met before the walk ends, so none past a container that is too deep
 * (decode refuses such a payload for its depth first). */
static PyObject *scan(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t limit, found, bad[2] = {-1, 0};
    PyObject *result = NULL;

    (void)self;
    if (!PyArg_ParseTuple(args, "y*n:scan", &view, &limit))
        return NULL;
    if (limit < 0 || limit > MAX_LIMIT) {
        PyErr_Format(PyExc_ValueError, "limit %zd: 0 to %d", limit, MAX_LIMIT);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    found = walk(view.buf, (size_t)view.len, (size_t)limit, bad);
    Py_END_ALLOW_THREADS
    if (found < 0 && bad[0] < 0)
        result = Py_BuildValue("(OO)", Py_None, Py_None);
    else if (found < 0)
        result = Py_BuildValue("(O(nn))", Py_None, bad[0], bad[1]);
    else if (bad[0] < 0)
        result = Py_BuildValue("(nO)", found, Py_None);
    else
        result = Py_BuildValue("(n(nn))", found, bad[0], bad[1]);
done:
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(payload, limit) -> (first_too_deep, first_bad_string): the offset of the first "
     "container header nested deeper than limit levels or None, and the (offset, length) "
     "of the first str item whose bytes are not UTF-8 or None, in one pass"},
    {"first_too_deep", first_too_deep, METH_VARARGS,
     "first_too_deep(payload, limit) -> offset of the first container header nested "
     "deeper than limit levels, or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sockherd.ipc._depth",
    "How deep a msgpack payload nests (ipc/nesting.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__depth(void)
{
    init_tables();
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "MAX_LIMIT", MAX_LIMIT) < 0)
        Py_CLEAR(m);
    return m;
}
