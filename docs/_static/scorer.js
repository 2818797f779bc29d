/*
 * The site's search ranking (docs/conf.py, html_search_scorer): Sphinx's scores, with the
 * guides first. A search for a name users know from another library
 * (AtariDQNExperienceReplay, get_atari_transitions, create_dataset) or for a job
 * (windows, convert) finds the guide that answers it before the API entries, whose names
 * the guide links to.
 */
var Scorer = {
  score: (result) => {
    const [docname, , , , score] = result;
    return docname.startsWith("guides/") ? score + 10 : score;
  },
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: { 0: 15, 1: 5, 2: -5 },
  objPrioDefault: 0,
  title: 15,
  partialTitle: 7,
  term: 5,
  partialTerm: 2,
};
