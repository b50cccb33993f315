/* "Did you mean": the one suggester of the library and the `moe` tool (moe.h moe_suggest). An
 * unknown MOE_* variable (knobs.c), command, option, model, scheme or family name is compared
 * with the names that exist, and the closest is offered when it is close enough to be the
 * name the user meant. */
#include "moe.h"

#include <ctype.h>
#include <stddef.h>
#include <string.h>

enum { SUGGEST_MAX_LEN = 63 };

static int fold(char c)
{
    return tolower((unsigned char)c);
}

/* Optimal string alignment distance (Levenshtein plus the swap of two neighbours, each
 * counted once) of a[0, la) and b[0, lb), letters compared without case. */
static size_t osa_distance(const char *a, size_t la, const char *b, size_t lb)
{
    /* three rows of the [la + 1, lb + 1] table: i - 2, i - 1 and i */
    size_t r0[SUGGEST_MAX_LEN + 1], r1[SUGGEST_MAX_LEN + 1], r2[SUGGEST_MAX_LEN + 1];
    size_t *prev2 = r0, *prev = r1, *cur = r2;
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            const size_t cost = fold(a[i - 1]) == fold(b[j - 1]) ? 0 : 1;
            size_t best = prev[j - 1] + cost;  /* substitute (or keep) */
            if (prev[j] + 1 < best)            /* delete a[i - 1] */
                best = prev[j] + 1;
            if (cur[j - 1] + 1 < best)         /* insert b[j - 1] */
                best = cur[j - 1] + 1;
            if (i > 1 && j > 1 && fold(a[i - 1]) == fold(b[j - 2]) && fold(a[i - 2]) == fold(b[j - 1]) &&
                prev2[j - 2] + 1 < best)       /* swap a[i - 2] and a[i - 1] */
                best = prev2[j - 2] + 1;
            cur[j] = best;
        }
        size_t *t = prev2;
        prev2 = prev;
        prev = cur;
        cur = t;
    }
    return prev[lb];
}

/* The number of letters in s[0, n) after its leading dashes. */
static size_t letters(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && s[i] == '-')
        i++;
    return n - i;
}

const char *moe_suggest(const char *word, size_t word_len, const char *const *candidates, size_t n)
{
    if (!word || !candidates || word_len == 0 || word_len > SUGGEST_MAX_LEN)
        return NULL;
    const size_t wl = letters(word, word_len);
    /* A close name is at most a third of the word's letters away (one edit for up to five
     * letters, two for six to eight, ...): "--hlep" is --help, "int5" is int4. */
    const size_t allowed = wl / 3 > 1 ? wl / 3 : 1;
    const char *best = NULL;
    size_t best_score = (size_t)-1;
    for (size_t k = 0; k < n; k++) {
        const char *c = candidates[k];
        if (!c)
            continue;
        const size_t cl = strlen(c);
        if (cl > SUGGEST_MAX_LEN)
            continue;
        size_t score = osa_distance(word, word_len, c, cl);
        /* A word of three letters or more that starts the candidate (an abbreviation, the name
         * without its suffix: qwen3.5-35b for qwen3.5-35b-a3b) counts as one edit away. */
        if (score > 1 && wl >= 3 && cl > word_len) {
            size_t i = 0;
            while (i < word_len && fold(word[i]) == fold(c[i]))
                i++;
            if (i == word_len)
                score = 1;
        }
        if (score <= allowed && score < best_score) {
            best_score = score;
            best = c;
        }
    }
    return best;
}
