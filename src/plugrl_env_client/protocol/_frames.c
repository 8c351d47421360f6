/* The compiled route of frame_packer.FramePacker: a message's msgpack bytes written straight into its frame, masked
 * as they are written (each array's data read once), byte for byte what MessageWriter, apply_mask and frame_header
 * make of it.
 *
 * frame(msg, key, layouts, miss, ndarray, timed, clock) -> bytes | memoryview | None
 *
 * It lays out what the rollout's messages hold: maps of exact dict type with str, int or bytes keys; str, int, float,
 * bool, None and bytes values; plain ndarrays (exact type, C-contiguous, exporting their buffer) through the writer's
 * layouts (the bytes before and after an array's data, keyed by (dtype, shape); ``miss(arr)`` makes a missing one or
 * returns None for an array the writer does not lay out); and timed parts (``timed`` objects: their ``value`` laid out
 * where they stand and ``seconds`` set from ``clock()``; each counts as a level of nesting). For anything else (a
 * list, a numpy scalar, an int beyond 64 bits, a str with a lone surrogate, maps or timed parts nested MAX_DEPTH
 * deep, a map that changes size while it is written) it returns None and the caller writes the message in Python,
 * which also says what cannot travel.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 32 /* codec.MAX_DEPTH */

/* The frame being written, each call's own (a callback may let another thread frame a message meanwhile): the room
 * for the header and the key first, then the payload, masked as it is written. On the C stack while it fits (a small
 * message's frame is then copied out whole), else in a bytearray that becomes the frame (a big one is not copied). */
typedef struct {
    unsigned char *data;
    Py_ssize_t len, cap; /* len counts the head room */
    PyObject *buf;       /* the bytearray, once the frame outgrew the stack (NULL before) */
    unsigned char key[4];
} Out;

#define HEAD_ROOM 14 /* the longest header (10 bytes) and the key */
#define STACK_BYTES 8192
static PyObject *s_dtype, *s_shape, *s_value, *s_seconds; /* attribute names, made once */

typedef struct {
    PyObject *layouts, *miss, *ndarray, *timed, *clock;
} Ctx;

enum { OK = 0, FALLBACK = 1, ERROR = -1 };

static int grow(Out *out, Py_ssize_t more) {
    if (more > PY_SSIZE_T_MAX / 2 - out->len) {
        PyErr_NoMemory();
        return ERROR;
    }
    Py_ssize_t need = out->len + more;
    if (need <= out->cap) return OK;
    Py_ssize_t cap = out->cap;
    while (cap < need) cap *= 2;
    if (out->buf == NULL) {
        out->buf = PyByteArray_FromStringAndSize((const char *)out->data, out->len);
        if (out->buf == NULL) return ERROR;
    }
    if (PyByteArray_Resize(out->buf, cap) < 0) return ERROR;
    out->data = (unsigned char *)PyByteArray_AS_STRING(out->buf);
    out->cap = cap;
    return OK;
}

/* ``n`` bytes appended, masked: payload byte i is XORed with key[i % 4] (RFC 6455), eight bytes at a time. */
static int put(Out *out, const void *bytes, Py_ssize_t n) {
    if (grow(out, n) != OK) return ERROR;
    const unsigned char *src = (const unsigned char *)bytes;
    unsigned char *dst = out->data + out->len;
    Py_ssize_t phase = out->len - HEAD_ROOM, i = 0;
    for (; i < n && ((phase + i) & 3); i++) dst[i] = src[i] ^ out->key[(phase + i) & 3];
    if (n - i >= 8) {
        uint64_t word_key;
        unsigned char eight[8];
        for (int k = 0; k < 8; k++) eight[k] = out->key[k & 3];
        memcpy(&word_key, eight, 8);
        for (; i + 8 <= n; i += 8) {
            uint64_t word;
            memcpy(&word, src + i, 8);
            word ^= word_key;
            memcpy(dst + i, &word, 8);
        }
    }
    for (; i < n; i++) dst[i] = src[i] ^ out->key[(phase + i) & 3];
    out->len += n;
    return OK;
}

/* A msgpack header: ``tag`` then ``n`` as a big-endian integer of ``size`` bytes. */
static int head(Out *out, unsigned char tag, uint64_t n, int size) {
    unsigned char b[9];
    b[0] = tag;
    for (int i = 0; i < size; i++) b[1 + i] = (unsigned char)(n >> (8 * (size - 1 - i)));
    return put(out, b, 1 + size);
}

static int pack_map_header(Out *out, Py_ssize_t n) {
    if (n < 16) return head(out, (unsigned char)(0x80 | n), 0, 0);
    if (n < 65536) return head(out, 0xde, (uint64_t)n, 2);
    return head(out, 0xdf, (uint64_t)n, 4);
}

static int pack_raw(Out *out, const char *bytes, Py_ssize_t n, int is_str) {
    int ok;
    if (is_str && n < 32) ok = head(out, (unsigned char)(0xa0 | n), 0, 0);
    else if (n < 256) ok = head(out, is_str ? 0xd9 : 0xc4, (uint64_t)n, 1);
    else if (n < 65536) ok = head(out, is_str ? 0xda : 0xc5, (uint64_t)n, 2);
    else if ((uint64_t)n < ((uint64_t)1 << 32)) ok = head(out, is_str ? 0xdb : 0xc6, (uint64_t)n, 4);
    else return FALLBACK;
    return ok == OK ? put(out, bytes, n) : ERROR;
}

static int pack_str(Out *out, PyObject *text) {
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &n);
    if (utf8 == NULL) { /* a lone surrogate: the Python writer raises what msgpack raises */
        PyErr_Clear();
        return FALLBACK;
    }
    return pack_raw(out, utf8, n, 1);
}

static int pack_int(Out *out, PyObject *obj) {
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) return ERROR;
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(obj);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return FALLBACK; /* beyond 64 bits */
        }
        return head(out, 0xcf, u, 8);
    }
    if (overflow < 0) return FALLBACK;
    if (v >= 0) {
        if (v < 128) return head(out, (unsigned char)v, 0, 0);
        if (v < 256) return head(out, 0xcc, (uint64_t)v, 1);
        if (v < 65536) return head(out, 0xcd, (uint64_t)v, 2);
        if (v < 4294967296LL) return head(out, 0xce, (uint64_t)v, 4);
        return head(out, 0xcf, (uint64_t)v, 8);
    }
    if (v >= -32) return head(out, (unsigned char)(v & 0xff), 0, 0);
    if (v >= -128) return head(out, 0xd0, (uint64_t)v & 0xff, 1);
    if (v >= -32768) return head(out, 0xd1, (uint64_t)v & 0xffff, 2);
    if (v >= -2147483648LL) return head(out, 0xd2, (uint64_t)v & 0xffffffff, 4);
    return head(out, 0xd3, (uint64_t)v, 8);
}

static int pack_float(Out *out, double v) {
    uint64_t bits;
    memcpy(&bits, &v, 8);
    return head(out, 0xcb, bits, 8);
}

/* A key the writer packs with msgpack: str, int or bytes; anything else goes to the Python writer. */
static int pack_key(Out *out, PyObject *key) {
    if (PyUnicode_CheckExact(key)) return pack_str(out, key);
    if (PyLong_CheckExact(key)) return pack_int(out, key);
    if (PyBytes_CheckExact(key)) return pack_raw(out, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), 0);
    return FALLBACK;
}

/* A plain ndarray: the layout's bytes before its data, its data, the layout's bytes after. */
static int pack_array(Out *out, PyObject *arr, Ctx *ctx) {
    Py_buffer view;
    if (PyObject_GetBuffer(arr, &view, PyBUF_SIMPLE) < 0) { /* not C-contiguous, or no buffer to lend */
        PyErr_Clear();
        return FALLBACK;
    }
    int result = FALLBACK;
    PyObject *dtype = PyObject_GetAttr(arr, s_dtype);
    PyObject *shape = dtype ? PyObject_GetAttr(arr, s_shape) : NULL;
    PyObject *key = shape ? PyTuple_Pack(2, dtype, shape) : NULL;
    PyObject *layout = NULL;
    if (key == NULL) {
        result = ERROR;
        goto done;
    }
    layout = PyDict_GetItemWithError(ctx->layouts, key); /* borrowed */
    if (layout != NULL) {
        Py_INCREF(layout);
    } else if (PyErr_Occurred()) {
        result = ERROR;
        goto done;
    } else {
        layout = PyObject_CallOneArg(ctx->miss, arr);
        if (layout == NULL) {
            result = ERROR;
            goto done;
        }
    }
    if (PyTuple_CheckExact(layout) && PyTuple_GET_SIZE(layout) == 2 && PyBytes_CheckExact(PyTuple_GET_ITEM(layout, 0))
        && PyBytes_CheckExact(PyTuple_GET_ITEM(layout, 1))) {
        PyObject *before = PyTuple_GET_ITEM(layout, 0), *after = PyTuple_GET_ITEM(layout, 1);
        if (put(out, PyBytes_AS_STRING(before), PyBytes_GET_SIZE(before)) != OK
            || put(out, view.buf, view.len) != OK || put(out, PyBytes_AS_STRING(after), PyBytes_GET_SIZE(after)) != OK)
            result = ERROR;
        else
            result = OK;
    } /* None: an array the writer does not lay out */
done:
    Py_XDECREF(layout);
    Py_XDECREF(key);
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    PyBuffer_Release(&view);
    return result;
}

static int pack_value(Out *out, PyObject *obj, Ctx *ctx, int depth);

/* A timed part: its value laid out where it stands, and the seconds that took. */
static int pack_timed(Out *out, PyObject *timed, Ctx *ctx, int depth) {
    if (depth >= MAX_DEPTH) return FALLBACK; /* timed parts count as a level: a chain of them ends here too */
    PyObject *start = PyObject_CallNoArgs(ctx->clock);
    if (start == NULL) return ERROR;
    Py_INCREF(timed); /* the clock and the layouts' callback run Python code: hold what is walked */
    PyObject *value = PyObject_GetAttr(timed, s_value);
    int result = value ? pack_value(out, value, ctx, depth + 1) : ERROR;
    Py_XDECREF(value);
    if (result == OK) {
        PyObject *end = PyObject_CallNoArgs(ctx->clock);
        PyObject *seconds = end ? PyNumber_Subtract(end, start) : NULL;
        if (seconds == NULL || PyObject_SetAttr(timed, s_seconds, seconds) < 0) result = ERROR;
        Py_XDECREF(seconds);
        Py_XDECREF(end);
    }
    Py_DECREF(timed);
    Py_DECREF(start);
    return result;
}

/* A map's entries, each key and value held while it is written (the layouts' callback and the clock run Python
 * code, which may change the map); a map whose size changes meanwhile goes to the Python writer. */
static int pack_map(Out *out, PyObject *map, Ctx *ctx, int depth) {
    if (depth >= MAX_DEPTH) return FALLBACK;
    Py_ssize_t size = PyDict_GET_SIZE(map);
    if (pack_map_header(out, size) != OK) return ERROR;
    Py_INCREF(map);
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    Py_ssize_t written = 0;
    int result = OK;
    while (result == OK && PyDict_Next(map, &pos, &key, &value)) {
        written++;
        Py_INCREF(key);
        Py_INCREF(value);
        result = pack_key(out, key);
        if (result == OK) {
            if (Py_IS_TYPE(value, (PyTypeObject *)ctx->ndarray)) result = pack_array(out, value, ctx);
            else result = pack_value(out, value, ctx, depth + 1);
        }
        Py_DECREF(value);
        Py_DECREF(key);
        if (result == OK && PyDict_GET_SIZE(map) != size) result = FALLBACK;
    }
    if (result == OK && written != size) result = FALLBACK; /* changed and changed back: the header says otherwise */
    Py_DECREF(map);
    return result;
}

static int pack_value(Out *out, PyObject *obj, Ctx *ctx, int depth) {
    if (PyDict_CheckExact(obj)) return pack_map(out, obj, ctx, depth);
    if (PyUnicode_CheckExact(obj)) return pack_str(out, obj);
    if (obj == Py_None) return head(out, 0xc0, 0, 0);
    if (obj == Py_True) return head(out, 0xc3, 0, 0);
    if (obj == Py_False) return head(out, 0xc2, 0, 0);
    if (PyLong_CheckExact(obj)) return pack_int(out, obj);
    if (PyFloat_CheckExact(obj)) return pack_float(out, PyFloat_AS_DOUBLE(obj));
    if (PyBytes_CheckExact(obj)) return pack_raw(out, PyBytes_AS_STRING(obj), PyBytes_GET_SIZE(obj), 0);
    if (Py_IS_TYPE(obj, (PyTypeObject *)ctx->timed)) return pack_timed(out, obj, ctx, depth);
    return FALLBACK;
}

/* RFC 6455 framing: FIN and the binary opcode, the masked length in its shortest form, the key, in the head room
 * right before the payload; returns where the frame starts. */
static Py_ssize_t put_header(Out *out) {
    Py_ssize_t n = out->len - HEAD_ROOM;
    unsigned char header[10];
    Py_ssize_t h = 2;
    header[0] = 0x82;
    if (n < 126) {
        header[1] = (unsigned char)(0x80 | n);
    } else if (n < 65536) {
        header[1] = 0x80 | 126;
        header[2] = (unsigned char)(n >> 8);
        header[3] = (unsigned char)n;
        h = 4;
    } else {
        header[1] = 0x80 | 127;
        for (int i = 0; i < 8; i++) header[2 + i] = (unsigned char)((uint64_t)n >> (8 * (7 - i)));
        h = 10;
    }
    Py_ssize_t start = HEAD_ROOM - 4 - h;
    memcpy(out->data + start, header, h);
    memcpy(out->data + HEAD_ROOM - 4, out->key, 4);
    return start;
}

static PyObject *frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "frame(msg, key, layouts, miss, ndarray, timed, clock) takes 7 arguments");
        return NULL;
    }
    PyObject *msg = args[0], *key = args[1];
    if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) != 4 || !PyDict_CheckExact(args[2])
        || !PyType_Check(args[4]) || !PyType_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "frame: key must be 4 bytes, layouts a dict, ndarray and timed types");
        return NULL;
    }
    if (!PyDict_CheckExact(msg)) Py_RETURN_NONE;
    Ctx ctx = {args[2], args[3], args[4], args[5], args[6]};
    unsigned char stack[STACK_BYTES];
    Out out = {stack, HEAD_ROOM, STACK_BYTES, NULL, {0, 0, 0, 0}};
    memcpy(out.key, PyBytes_AS_STRING(key), 4);
    int result = pack_map(&out, msg, &ctx, 0);
    PyObject *framed = NULL;
    if (result == OK) {
        Py_ssize_t start = put_header(&out);
        if (out.buf == NULL) {
            framed = PyBytes_FromStringAndSize((const char *)out.data + start, out.len - start);
        } else {
            PyObject *view = PyMemoryView_FromObject(out.buf);
            PyObject *first = PyLong_FromSsize_t(start), *end = PyLong_FromSsize_t(out.len);
            PyObject *range = (view && first && end) ? PySlice_New(first, end, NULL) : NULL;
            framed = range ? PyObject_GetItem(view, range) : NULL;
            Py_XDECREF(range);
            Py_XDECREF(end);
            Py_XDECREF(first);
            Py_XDECREF(view);
        }
    } else if (result == FALLBACK) {
        framed = Py_None;
        Py_INCREF(framed);
    }
    Py_XDECREF(out.buf);
    return framed;
}

static PyMethodDef methods[] = {
    {"frame", (PyCFunction)(void (*)(void))frame, METH_FASTCALL,
     "frame(msg, key, layouts, miss, ndarray, timed, clock) -> the masked WebSocket frame of msg (bytes, or a "
     "memoryview of a bytearray), or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frames", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__frames(void) {
    s_dtype = PyUnicode_InternFromString("dtype");
    s_shape = PyUnicode_InternFromString("shape");
    s_value = PyUnicode_InternFromString("value");
    s_seconds = PyUnicode_InternFromString("seconds");
    if (s_dtype == NULL || s_shape == NULL || s_value == NULL || s_seconds == NULL) return NULL;
    return PyModule_Create(&module);
}
