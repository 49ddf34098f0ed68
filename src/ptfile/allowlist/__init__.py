"""Which globals a pickle may name, and what each one rebuilds.

=========================  ===============================================================
:mod:`.rebuild`            torch's ``_rebuild_*`` functions and storage classes, as inert
                           builders of :mod:`ptfile.model` objects (``weights_only``'s list)
:mod:`.reduction`          the save-side inverse: a model object to the reduction torch writes
:mod:`.policy`             the ``find_class`` policies: weights-only, ``safe_globals``,
                           structural
:mod:`.structural`         any pickle as an inert tree of stand-ins (``structural=True``)
:mod:`.numpy_globals`      :data:`ptfile.NUMPY_GLOBALS`: inert rebuilders of numpy values
=========================  ===============================================================
"""
